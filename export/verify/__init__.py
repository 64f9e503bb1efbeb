"""The export's third stage: each staged variant loaded and run through the service's own engine
and checked against its source (PyTorch, sentence-transformers) and against its fp32 variant.

``translation.TranslationVerifier.verify`` and ``embedding.EmbeddingVerifier.verify`` check one
staged variant each and return its figures; the checks they share (alone vs batched, the
reference sentences) are in ``determinism`` and ``reference_set``.
"""

from __future__ import annotations

Parity = dict[str, float]  # a variant's figures, recorded in Manifest.parity


class VerificationError(RuntimeError):
    """An exported graph is out of tolerance against its source; no manifest is written."""
