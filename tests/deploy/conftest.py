"""Fixtures of the deployment checks; helpers are in deploy_helpers.py.

The CPU image is built once per test run, in the background from the end of collection on, and
the tests that run it go last (tests/conftest.py): its build (minutes, a first one exports the
default models) runs beside every other test instead of before its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from containers import CPU_IMAGE, BackgroundBuild, Build, Engine, engine_here, find_engine
from deploy_helpers import KUSTOMIZATIONS, kustomize_build, require_tool

from tests.background import config_run_folder, run_folder

IMAGE_FIXTURE = "cpu_image"  # the tests that request it run last (tests/conftest.py)

_background: list[BackgroundBuild] = []  # the run's build of CPU_IMAGE, once started


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if not _background and any(IMAGE_FIXTURE in getattr(i, "fixturenames", ()) for i in session.items):
        engine, _ = engine_here()
        if engine is not None:  # without one, the image's tests skip saying why
            _background.append(BackgroundBuild(engine, "cpu", CPU_IMAGE, config_run_folder(session.config)))


@pytest.fixture(scope="session")
def kubectl() -> str:
    return require_tool("kubectl")


@pytest.fixture(scope="session")
def built(kubectl: str) -> dict[str, list[dict[str, Any]]]:
    """`kubectl kustomize` output of the base and of every overlay, parsed."""
    return {name: kustomize_build(kubectl, path) for name, path in KUSTOMIZATIONS.items()}


@pytest.fixture(scope="session")
def engine() -> Engine:
    """docker, else podman (skips where neither is installed)."""
    return find_engine()


@pytest.fixture(scope="session")
def cpu_image(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    """docker/Dockerfile built from this repository, tagged as k8s/overlays/cpu names it."""
    if not _background:  # a session that selected its tests some other way
        run = run_folder(tmp_path_factory.getbasetemp())
        _background.append(BackgroundBuild(engine, "cpu", CPU_IMAGE, run))
    build = _background[0].result()
    print(f"{CPU_IMAGE}: built in {build.seconds:.0f} s since it started, {build.size_bytes / 1e6:.0f} MB")
    yield build
