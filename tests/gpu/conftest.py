"""The tests of the GPU path. Each takes ``provider``: it runs on the CPU provider everywhere and,
marked ``cuda``, once more on CUDA where onnxruntime runs a session on a GPU (``make gpu-check``
runs them there); elsewhere the CUDA run skips and says why. The models are the tiny ones of
tests/conftest.py, exported by the export code itself.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@functools.cache
def cuda_unavailable() -> str | None:
    from benchmarks.gpu.check import cuda_unavailable as probe

    return probe()


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def provider(request: pytest.FixtureRequest) -> str:
    """The onnxruntime provider a test runs on (its ``session.SessionConfig`` name)."""
    if request.param == "cuda" and (reason := cuda_unavailable()) is not None:
        pytest.skip(f"no CUDA here: {reason}")
    return str(request.param)


@pytest.fixture
def cuda() -> None:
    """For the tests that mean something on a GPU only (they are marked ``cuda`` too)."""
    if (reason := cuda_unavailable()) is not None:
        pytest.skip(f"no CUDA here: {reason}")


@pytest.fixture(scope="session")
def embedding_fp16(embedding_source: Path, embedding_artefact: Path) -> Path:
    """The tiny embedding model's fp16 variant, next to its fp32 one."""
    from export.embedding import export_embedding

    (directory,) = export_embedding(embedding_source, embedding_artefact.parent.parent, ["fp16"])
    return Path(directory)
