"""Fixtures of the reliability tests: real servers on loopback, and one root holding the tiny real
ONNX artefacts of tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ServerProcess, server_process, small_server_command


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
    translation_artefact: Path,
    embedding_artefact: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """One root holding both tiny models, as ``python -m service`` expects: <root>/<name>/fp32."""
    root = tmp_path_factory.mktemp("served-artefacts")
    for artefact in (translation_artefact, embedding_artefact):
        (root / artefact.parent.name).symlink_to(artefact.parent, target_is_directory=True)
    return root
