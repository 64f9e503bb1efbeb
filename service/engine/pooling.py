"""L2 normalisation in NumPy, for the one case the embedding graph cannot do it: a vector cut to
its first ``dimensions`` (Matryoshka) is normalised after the cut, so that it is a unit vector
again. Pooling and the normalisation of whole vectors are in the graph (export/sources/bert.py).

Numerics follow the graph's ``torch.nn.functional.normalize``: each row divided by
max(norm, 1e-12), so a zero row stays zero instead of becoming NaN; computed in float32.
"""

from __future__ import annotations

import numpy as np

_MIN_NORM = 1e-12  # torch.nn.functional.normalize's default eps


def l2_normalize(x: np.ndarray, eps: float = _MIN_NORM) -> np.ndarray:
    """Scale each row to unit length; a zero row stays zero instead of becoming NaN."""
    v = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    unit: np.ndarray = (v / np.maximum(norms, eps)).astype(np.float32, copy=False)
    return unit
