"""Shared test settings: one CPU thread for torch (the machine is shared with training runs)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """Keep torch on one thread; the service tests run without torch installed."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
