"""Which rows' queries meet which sentence's memory in the slot decoder's cross-attention.

The ``per_layer_kv_slots`` graph holds each sentence's memory once for all its beams and folds
the rows' queries onto it (``export/sources/cached_attention.py``, ``folded_cross_attention``):
``sentence_rows`` gathers each sentence's rows side by side, ``beam_index`` sends them back.
"""

from __future__ import annotations

import numpy as np


def fold_beams(row_sentence: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The decoder's ``sentence_rows`` and ``beam_index`` for rows decoding ``row_sentence`` (N,)
    whose memory is in the slots holding ``held`` (sentences,): slot s's rows side by side,
    padded to a width of at least 2 by repeating its first row, and row n's place among the
    sentences × width folded queries."""
    n, slots = len(row_sentence), len(held)
    order = np.argsort(held)
    slot = order[np.searchsorted(held, row_sentence, sorter=order)]  # each row's memory slot
    counts = np.bincount(slot, minlength=slots)
    width = max(2, int(counts.max()))
    by_slot = np.argsort(slot, kind="stable")
    starts = np.cumsum(counts) - counts
    rank = np.empty(n, dtype=np.int64)
    rank[by_slot] = np.arange(n) - starts[slot[by_slot]]
    sentence_rows = np.repeat(by_slot[starts][:, None], width, axis=1)
    sentence_rows[slot, rank] = np.arange(n)
    return sentence_rows, slot * width + rank
