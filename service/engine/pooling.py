"""Sentence-embedding pooling in NumPy: the exact functions the service serves with.

The export step verifies its ONNX graphs through these same functions (against the
sentence-transformers pipeline), so what is verified is what is served. NumPy only, no torch:
this module belongs to the onnxruntime world.

Numerics follow sentence-transformers: mean pooling divides by the token count clamped at 1e-9
(a row with no tokens pools to zeros, not NaN); L2 normalisation divides by max(norm, 1e-12)
like ``torch.nn.functional.normalize``; last-token pooling takes each row's last real token (the
service pads on the right, so not the last position) and a row with no tokens pools to zeros, as
sentence-transformers' ``lasttoken`` mode gives them. Everything is computed in float32 even when the graph
returns float16, so an fp16 graph's pooled output is as precise as its hidden states allow.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Pooling = Literal["mean", "cls", "lasttoken"]

_MIN_COUNT = 1e-9  # sentence-transformers' clamp on the token count
_MIN_NORM = 1e-12  # torch.nn.functional.normalize's default eps


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average the hidden states of real tokens: (batch, seq, dim) × (batch, seq) → (batch, dim).

    Padding positions hold whatever the graph computed for them; the mask keeps them out.
    """
    h = np.asarray(hidden, dtype=np.float32)
    m = np.asarray(mask, dtype=np.float32)[:, :, None]
    summed = (h * m).sum(axis=1)
    counts = np.maximum(m.sum(axis=1), _MIN_COUNT)
    pooled: np.ndarray = (summed / counts).astype(np.float32, copy=False)
    return pooled


def cls_pool(hidden: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """The first token's hidden state ([CLS]); ``mask`` is accepted for a uniform signature."""
    del mask  # the first position is always a real token (right padding)
    return np.asarray(hidden[:, 0, :], dtype=np.float32)


def last_token_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The hidden state of each row's last real token: (batch, seq, dim) × (batch, seq) → (batch, dim)."""
    m = np.asarray(mask)
    # the last index where the mask is set (a row without any: the last position, zeroed below)
    seq = m.shape[1]
    last = seq - 1 - np.argmax(m[:, ::-1] != 0, axis=1)
    rows = np.arange(m.shape[0])
    picked = np.asarray(hidden[rows, last, :], dtype=np.float32)
    picked[~m.any(axis=1)] = 0.0
    return picked


def l2_normalize(x: np.ndarray, eps: float = _MIN_NORM) -> np.ndarray:
    """Scale each row to unit length; a zero row stays zero instead of becoming NaN."""
    v = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    unit: np.ndarray = (v / np.maximum(norms, eps)).astype(np.float32, copy=False)
    return unit


def pool(hidden: np.ndarray, mask: np.ndarray, mode: Pooling) -> np.ndarray:
    """Dispatch on the manifest's ``embedding.pooling``."""
    if mode == "mean":
        return mean_pool(hidden, mask)
    if mode == "cls":
        return cls_pool(hidden, mask)
    if mode == "lasttoken":
        return last_token_pool(hidden, mask)
    raise ValueError(f"unknown pooling mode {mode!r} (expected 'mean', 'cls' or 'lasttoken')")
