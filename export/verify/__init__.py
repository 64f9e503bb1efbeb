"""The export's third stage: each staged variant loaded and run through the service's own engine
and checked against its source (PyTorch, sentence-transformers) and against its fp32 variant.

``translation.TranslationVerifier.verify`` and ``embedding.EmbeddingVerifier.verify`` check one
staged variant each and return its figures; the checks they share (alone vs batched, the
reference sentences) are in ``determinism`` and ``reference_set``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

Parity = dict[str, float]  # a variant's figures, recorded in Manifest.parity


class VerificationError(RuntimeError):
    """An exported graph is out of tolerance against its source; no manifest is written."""


def load_staged(open_engine: Callable[[Path, int], T], directory: Path, threads: int, what: str) -> T:
    """The staged ``directory`` opened as the service opens it, or the reason it cannot be (e.g.
    an fp16 kernel missing on the CPU provider) as a VerificationError naming ``what``."""
    try:
        return open_engine(directory, threads)
    except Exception as e:
        raise VerificationError(f"{what}: onnxruntime cannot load {directory} on CPU: {e}") from e
