"""Fixtures of the deployment checks; helpers are in deploy_helpers.py.

The CPU image is built once per test run, in the background from the end of collection on, and
the tests that run it go last (tests/conftest.py): its build runs beside every other test instead
of before its own, and its export stage starts from the run's export of the default models
(containers.BackgroundBuild) rather than exporting them again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from containers import CPU_IMAGE, BackgroundBuild, Build, Engine, engine_here, find_engine
from deploy_helpers import KUSTOMIZATIONS, kustomize_build, require_tool

from tests.background import config_run_folder, run_folder

if TYPE_CHECKING:
    from tests.e2e.real_models import DefaultArtefacts

IMAGE_FIXTURE = "cpu_image"  # the tests that request it run last (tests/conftest.py)

_background: list[BackgroundBuild] = []  # the run's build of CPU_IMAGE, once started


def _exported() -> DefaultArtefacts | None:
    """The session's export of the default models, if one of its tests started it."""
    try:
        from tests.e2e.real_models import started_export
    except ImportError:  # no export packages here, so no export either
        return None
    return started_export()


@pytest.hookimpl(trylast=True)  # after tests/conftest.py's, which starts the default models' export
def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if not _background and any(IMAGE_FIXTURE in getattr(i, "fixturenames", ()) for i in session.items):
        engine, _ = engine_here()
        if engine is not None:  # without one, the image's tests skip saying why
            run = config_run_folder(session.config)
            _background.append(BackgroundBuild(engine, "cpu", CPU_IMAGE, run, _exported()))


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
        _background.append(BackgroundBuild(engine, "cpu", CPU_IMAGE, run, _exported()))
    build = _background[0].result()
    print(f"{CPU_IMAGE}: built in {build.seconds:.0f} s since it started, {build.size_bytes / 1e6:.0f} MB")
    yield build
