"""The slot cache buffers of one engine's last decode, kept for its next decode.

A decode's cache buffers (``slots.SlotDecoder``: per layer K and V, rows × heads × columns ×
d_head, tens to hundreds of MB at a batch of 128 beams) are blocks the service maps afresh
(service/memory.py, ``map_large_blocks``): every page faults in as the decode first writes it,
and a decode whose history outgrows its buffers copies them into longer ones. Decodes follow one
another under load, each needing about what the last one held, so the last set is kept for the
next to take whole: no page faults, no regrowth. The service lets it go once idle
(``serving/runtime.py``), before it trims the heaps.

A taken buffer holds the last decode's values beyond what the new one writes; the decoder never
reads a row's columns past its position (``export/sources/cached_attention.py``), so the new
decode's results are those of fresh zeros.
"""

from __future__ import annotations

import threading

import numpy as np


class SpareBuffers:
    """At most one set of cache buffers, shared by the engine's decodes (on several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[np.ndarray] = []

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._kept)

    def give(self, buffers: list[np.ndarray]) -> None:
        """A decode's buffers as it empties; they replace any kept before."""
        if buffers and buffers[0].size:
            with self._lock:
                self._kept = buffers

    def take(self, rows: int, columns: int) -> list[np.ndarray] | None:
        """The kept buffers if they hold ``rows`` slots of ``columns`` columns (they may hold
        more). The kept set is let go either way: a decode that outgrows it would otherwise hold
        both."""
        with self._lock:
            kept, self._kept = self._kept, []
        if not kept or kept[0].shape[0] < rows or kept[0].shape[2] < columns:
            return None
        return kept

    def release(self) -> int:
        """Let the kept buffers go; → the bytes they held."""
        with self._lock:
            kept, self._kept = self._kept, []
        return sum(b.nbytes for b in kept)
