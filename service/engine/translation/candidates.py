"""What a decoder step gives the search, and what the search asks of a decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Candidates:
    """Each row's best next tokens, best first, as a decoder graph with an in-graph ``TopK``
    returns them: at least the search's 2 × beam per row (or the whole vocabulary)."""

    log_probs: np.ndarray  # (N, n) float32
    tokens: np.ndarray  # (N, n) int64
    # The log-probs of the tokens the search asked for (``Search.wanted_tokens``: constrained
    # sentences' next constraint tokens), (N, m); None when it asked for none.
    wanted: np.ndarray | None = None


class IncrementalDecoder(Protocol):
    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        """(N,) int64 → log-probs (N, V) float32 or the rows' ``Candidates``, and, if tracked,
        cross-attention (N, S)."""
        ...

    def reorder(self, rows: np.ndarray) -> None:
        """Keep cache rows ``rows`` (int64, may repeat), in that order."""
        ...
