"""The fp16 embedder on the GPU path: the vectors of fp32, alone or inside a batch.

As the translator's: each test runs on the CPU provider here, and on CUDA in ``make gpu-check``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from service.engine.base import Embedding, EmbedItem
from service.engine.embedder import OnnxEmbedder
from service.engine.loader import load_engine
from service.engine.session import SessionConfig
from tests.gpu.conftest import PROVIDER_NAMES
from tests.service.engine.test_embedder import TEXTS

MIN_COSINE = 0.999  # fp16 against fp32 (and a batch's padding against none)


def served(directory: Path, provider: str) -> OnnxEmbedder:
    """The embedder as the service loads it on ``provider`` (service/serving/startup.py)."""
    engine = load_engine(directory, SessionConfig(provider, 1))
    assert isinstance(engine, OnnxEmbedder)
    return engine


def vectors(engine: OnnxEmbedder, texts: list[str]) -> np.ndarray:
    out = engine.embed([EmbedItem(t) for t in texts])
    assert all(isinstance(r, Embedding) for r in out), out
    return np.stack([r.vector for r in out if isinstance(r, Embedding)])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def test_fp16_embeds_as_fp32_does(provider: str, embedding_fp16: Path, embedding_artefact: Path) -> None:
    half, full = served(embedding_fp16, provider), served(embedding_artefact, "cpu")
    assert (half.manifest.variant, half.provider) == ("fp16", PROVIDER_NAMES[provider])
    got = vectors(half, TEXTS)
    assert got.dtype == np.float32
    assert cosines(got, vectors(full, TEXTS)).min() >= MIN_COSINE


def test_the_same_vector_alone_and_inside_batches(provider: str, embedding_fp16: Path) -> None:
    """Texts of different lengths embedded together (padded to the longest) and one by one."""
    engine = served(embedding_fp16, provider)
    together = vectors(engine, TEXTS * 3)
    alone = np.concatenate([vectors(engine, [t]) for t in TEXTS * 3])
    assert cosines(together, alone).min() >= MIN_COSINE
