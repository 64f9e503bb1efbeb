"""Fixtures of the deployment checks; helpers are in deploy_helpers.py."""

from __future__ import annotations

from typing import Any

import pytest
from deploy_helpers import KUSTOMIZATIONS, kustomize_build, require_tool


@pytest.fixture(scope="session")
def kubectl() -> str:
    return require_tool("kubectl")


@pytest.fixture(scope="session")
def built(kubectl: str) -> dict[str, list[dict[str, Any]]]:
    """`kubectl kustomize` output of the base and of every overlay, parsed."""
    return {name: kustomize_build(kubectl, path) for name, path in KUSTOMIZATIONS.items()}
