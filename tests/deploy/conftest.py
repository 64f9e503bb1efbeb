"""Fixtures of the deployment checks; helpers are in deploy_helpers.py."""

from __future__ import annotations

from typing import Any

import pytest
from containers import CPU_IMAGE, Build, Engine, build_image, find_engine
from deploy_helpers import KUSTOMIZATIONS, kustomize_build, require_tool


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
def cpu_image(engine: Engine) -> Build:
    """docker/Dockerfile built from this repository, tagged as k8s/overlays/cpu names it."""
    build = build_image(engine, "cpu", CPU_IMAGE)
    print(f"{CPU_IMAGE}: built in {build.seconds:.0f} s, {build.size_bytes / 1e6:.0f} MB")
    return build
