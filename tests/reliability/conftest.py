"""Fixtures of the reliability tests: real servers on loopback, and the tiny real ONNX artefacts
of tests/service/engine (reused, not rebuilt differently)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ServerProcess, server_process, small_server_command
from tests.service.engine.conftest import (  # noqa: F401 (fixtures, used by name)
    embedding_artefact,
    embedding_source,
    translation_artefact,
    translation_checkpoint,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """tests/service/run_small_server.py with the default settings (limits included), no delay."""
    log = tmp_path_factory.mktemp("small-server") / "server.log"
    with server_process(small_server_command(), {}, log) as server:
        yield server


@pytest.fixture(scope="session")
def artefact_root(
    translation_artefact: Path,  # noqa: F811
    embedding_artefact: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """One root holding both tiny models, as ``python -m service`` expects: <root>/<name>/fp32."""
    root = tmp_path_factory.mktemp("served-artefacts")
    for artefact in (translation_artefact, embedding_artefact):
        (root / artefact.parent.name).symlink_to(artefact.parent, target_is_directory=True)
    return root
