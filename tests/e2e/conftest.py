"""Fixtures of the end-to-end tests: the real default models served by ``python -m service`` on
loopback (tests/e2e/real_models.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.real_models import served_env, start_service
from tests.servers import ServerProcess


@pytest.fixture(scope="session")
def service(default_artefacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The real service, fp32, every other setting at its default."""
    yield from start_service(tmp_path_factory, "service-fp32", served_env(default_artefacts, "fp32"))


@pytest.fixture(scope="session")
def int8_service(
    default_artefacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    yield from start_service(tmp_path_factory, "service-int8", served_env(default_artefacts, "int8"))


@pytest.fixture
def client(service: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=120) as c:
        yield c
