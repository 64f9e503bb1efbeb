"""The slot cache buffers of one engine's last decode, kept for its next decode.

A decode's cache buffers (``slots.SlotDecoder``: one block of per-layer K and V, 2 × layers ×
rows × heads × columns × d_head, tens to hundreds of MB at a batch of 128 beams) are blocks the
service maps afresh (service/memory.py, ``map_large_blocks``): every page faults in as the
decode first writes it, and a decode whose history outgrows its buffers copies them into longer
ones. Decodes follow one another under load, each needing about what the last one held, so the
last set is kept for the next to take whole: no page faults, no regrowth. The service lets it go
once idle (``serving/runtime.py``), before it trims the heaps.

A taken buffer holds the last decode's values beyond what the new one writes; the decoder never
reads a row's columns past its position (``export/sources/cached_attention.py``), so the new
decode's results are those of fresh zeros.
"""

from __future__ import annotations

import threading

import numpy as np


class SpareBuffers:
    """At most one block of cache buffers (2 × layers, rows, heads, columns, d_head), shared by
    the engine's decodes (on several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        with self._lock:
            return 0 if self._kept is None else self._kept.nbytes

    def give(self, buffers: np.ndarray) -> None:
        """A decode's buffers as it empties; they replace any kept before."""
        if buffers.size:
            with self._lock:
                self._kept = buffers

    def take(self, rows: int, columns: int) -> np.ndarray | None:
        """The kept buffers if they hold ``rows`` slots of ``columns`` columns (they may hold
        more). The kept set is let go either way: a decode that outgrows it would otherwise hold
        both."""
        with self._lock:
            kept, self._kept = self._kept, None
        if kept is None or kept.shape[1] < rows or kept.shape[3] < columns:
            return None
        return kept

    def release(self) -> int:
        """Let the kept buffers go; → the bytes they held."""
        with self._lock:
            kept, self._kept = self._kept, None
        return 0 if kept is None else kept.nbytes
