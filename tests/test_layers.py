"""The layers of service/ and the stages of export/ are contracts: import-linter's ``layers``
contracts in pyproject.toml, checked here against the project's import graph. A module may import
only from the layers below its own; an arrow back up fails this test and names its chain.
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path

import grimp
import pytest
from importlinter.application.use_cases import read_user_options
from importlinter.application.user_options import UserOptions
from importlinter.configuration import configure
from importlinter.contracts.layers import LayersContract

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def options() -> UserOptions:
    """``[tool.importlinter]``, read as ``lint-imports`` reads it."""
    configure()
    return read_user_options(str(PYPROJECT))


def contracts() -> list[LayersContract]:
    read = options()
    return [
        LayersContract(name=raw["name"], session_options=read.session_options, contract_options=raw)
        for raw in read.contracts_options
    ]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*options().session_options["root_packages"], cache_dir=None)


def broken_chains(contract: LayersContract, graph: grimp.ImportGraph) -> list[str]:
    """Each import chain that goes up a layer, as ``a → b → c``; empty when the contract holds."""
    check = contract.check(deepcopy(graph), verbose=False)
    if check.kept:
        return []
    chains = [
        " → ".join([route["chain"][0]["importer"], *(link["imported"] for link in route["chain"])])
        for dependency in check.metadata.get("invalid_dependencies", [])
        for route in dependency["routes"]
    ]
    unplaced = sorted(check.metadata.get("undeclared_modules", ()))
    return chains + [f"{module}: in no layer" for module in unplaced]


@pytest.mark.parametrize("contract", contracts(), ids=lambda c: c.name)
def test_no_import_goes_up_a_layer(contract: LayersContract, graph: grimp.ImportGraph) -> None:
    chains = broken_chains(contract, graph)
    assert not chains, f"{contract.name}: imports up the layers:\n" + "\n".join(chains)


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("service.engine.base", "service.serving.failures"),  # the engine knowing the serving layer
        ("service.queue.requests", "service.api.error_responses"),  # the queue knowing HTTP
        ("service.settings", "service.engine.session"),  # a bottom module reaching up
        ("export.sources.ours.model", "export.verify"),  # a source knowing its verification
    ],
)
def test_a_planted_import_up_the_layers_fails(importer: str, imported: str, graph: grimp.ImportGraph) -> None:
    planted = deepcopy(graph)
    planted.add_import(importer=importer, imported=imported)
    (contract,) = [c for c in contracts() if c.contract_options["containers"] == [importer.split(".")[0]]]
    chains = broken_chains(contract, planted)
    assert any(chain.startswith(importer) and imported in chain for chain in chains), chains


def test_a_new_top_level_module_needs_a_layer(graph: grimp.ImportGraph) -> None:
    planted = deepcopy(graph)
    planted.add_module("service.unplaced")
    (contract,) = [c for c in contracts() if c.name == "service layers"]
    assert broken_chains(contract, planted) == ["service.unplaced: in no layer"]
