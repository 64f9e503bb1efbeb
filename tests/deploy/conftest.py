"""Fixtures of the deployment checks; helpers are in deploy_helpers.py.

The CPU image is built once per session, in the background from the end of collection on, and
the tests that run it go last: its build (minutes, a first one exports the default models) runs
beside every other test instead of before its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from containers import CPU_IMAGE, BackgroundBuild, Build, Engine, engine_here, find_engine
from deploy_helpers import KUSTOMIZATIONS, kustomize_build, require_tool

IMAGE_FIXTURE = "cpu_image"
_background: list[BackgroundBuild] = []  # the session's build of CPU_IMAGE, once started


def _needs_image(item: pytest.Item) -> bool:
    return IMAGE_FIXTURE in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that run the image last, in their order."""
    items[:] = [i for i in items if not _needs_image(i)] + [i for i in items if _needs_image(i)]


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if not _background and any(_needs_image(i) for i in session.items):
        engine, _ = engine_here()
        if engine is not None:  # without one, the image's tests skip saying why
            _background.append(BackgroundBuild(engine, "cpu", CPU_IMAGE))


def pytest_sessionfinish() -> None:
    for build in _background:
        build.stop()  # a session cut short leaves no build behind


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
def cpu_image(engine: Engine) -> Iterator[Build]:
    """docker/Dockerfile built from this repository, tagged as k8s/overlays/cpu names it."""
    if not _background:  # a session that selected its tests some other way
        _background.append(BackgroundBuild(engine, "cpu", CPU_IMAGE))
    build = _background[0].result()
    print(f"{CPU_IMAGE}: built in {build.seconds:.0f} s since it started, {build.size_bytes / 1e6:.0f} MB")
    yield build
