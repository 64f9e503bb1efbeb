"""The decoder of layout ``per_layer_kv_positions`` (the fp16 variant, the GPU's): a per-layer
self-attention cache that grows by one column a step, on either backend (``decoding.py``), in one
onnxruntime run a step.

Rows belong to sentences. The cross-attention memory depends only on a row's *sentence*, so it is
fed once per sentence (the table: the encoder's output cut into its layers, no copy) with
``memory_rows``, each row's sentence. The cache is never moved between steps: a reorder only
composes ``beam_rows``, the past row each row continues, and the next step's graph gathers each
layer's past by it before appending the new column (export/graphs/translation_layout.py).

Each row feeds its ``positions``, the tokens it has decoded, and its cached keys are the *last*
``positions`` columns of the past: so on the host backend sentences may join between steps
(``admit``), their rows continuing any past row (all its columns are masked at position 0); the
cache is cut back to the longest row's history when the rows that made it long have left. The
device backend holds the table as the encoder wrote it, so there ``admit`` needs an empty decoder.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.artefacts import (
    BEAM_ROWS,
    INPUT_IDS,
    MEMORY_KEYS,
    MEMORY_ROWS,
    MEMORY_VALUES,
    PAST_KEYS,
    PAST_VALUES,
    POSITIONS,
    SOURCE_MASK,
    TOP_K,
    per_layer,
)
from service.engine.translation.candidates import Candidates
from service.engine.translation.decoding import Decoder, StepBinding, Tensor


class PositionsDecoder(Decoder):
    """``search.IncrementalDecoder`` over a ``per_layer_kv_positions`` decoder, holding its cache."""

    memory_per_sentence = True
    steps_over_shortlists = False
    cache_on_host = False

    def _start(self) -> None:
        self._table: tuple[Tensor, Tensor] | None = None  # stacked memory K/V per sentence
        self._table_mask = np.zeros((0, 0), dtype=np.int64)  # (sentences, S) source masks
        self._row_sentence = np.zeros(0, dtype=np.int64)  # the memory_rows feed
        self._positions = np.zeros(0, dtype=np.int64)  # tokens each row has decoded
        self._memory: dict[str, Tensor] = {}  # the table's layers, by input name
        self._past = self._empty_cache()
        self._beam_rows = np.zeros(0, dtype=np.int64)  # each row's row of ``_past``
        self._past_len = 0
        self._bound = StepBinding()  # this decode's binding on the device backend
        # one array a ``top_k``: the same object each step, so the binding keeps it bound
        self._top_k: dict[int, np.ndarray] = {}

    @property
    def joins_midway(self) -> bool:
        return self.backend.host_arrays  # joining pads and concatenates host arrays

    @property
    def rows(self) -> int:
        return len(self._row_sentence)

    @property
    def sentences(self) -> int:
        return self._table_mask.shape[0]

    @property
    def source_len(self) -> int:
        return self._table_mask.shape[1]

    @property
    def cache_len(self) -> int:
        return self._past_len

    def reserve(self, rows: int, sentences: int, source_len: int) -> None:
        """Nothing: the memory grows by concatenating as sentences join, the cache by steps."""

    def admit(
        self,
        memory: tuple[Tensor, Tensor],
        source_mask: np.ndarray,
        repeats: Sequence[int],
        shortlists: Sequence[np.ndarray] | None = None,
    ) -> None:
        if shortlists is not None:
            raise ValueError("a per_layer_kv_positions decoder has no shortlist graph")
        if self.rows and not self.joins_midway:
            raise RuntimeError("this backend cannot admit rows into a running decode")
        if not self.rows:
            self._table = None
        first = self._compact()
        if self._table is None:
            self._table, self._table_mask = memory, source_mask
        else:
            self._table, self._table_mask = _join_memory(self._table, self._table_mask, memory, source_mask)
        new_rows = np.repeat(np.arange(first, first + len(repeats)), repeats)
        self._row_sentence = np.concatenate([self._row_sentence, new_rows])
        self._positions = np.concatenate([self._positions, np.zeros(len(new_rows), dtype=np.int64)])
        # At position 0 a row sees none of its past's columns: any past row will do as its own.
        self._beam_rows = np.concatenate([self._beam_rows, np.zeros(len(new_rows), dtype=np.int64)])
        self._memory = {
            per_layer(name, i): x
            for name, stacked in zip((MEMORY_KEYS, MEMORY_VALUES), self._table, strict=True)
            for i, x in enumerate(self.backend.layers(stacked))
        }

    def _compact(self) -> int:
        """Forget the table's sentences no row decodes any more; → the next sentence's index."""
        if self._table is None:
            return 0
        used = np.unique(self._row_sentence)
        if len(used) < self._table_mask.shape[0]:  # host arrays: only a joining decode gets here
            width = int(self._table_mask[used].sum(axis=1).max())  # the longest source still used
            keys, values = (np.asarray(x)[:, used, :, :width] for x in self._table)
            self._table = (keys, values)
            self._table_mask = self._table_mask[used, :width]
            self._row_sentence = np.searchsorted(used, self._row_sentence)
        return self._table_mask.shape[0]

    def _empty_cache(self) -> dict[str, Tensor]:
        """A past of no columns, with the one row every row's ``beam_rows`` may name."""
        layers, heads, d_head = self._cache_shape
        empty = np.zeros((1, heads, 0, d_head), dtype=self._cache_dtype)
        return {per_layer(name, i): empty for name in (PAST_KEYS, PAST_VALUES) for i in range(layers)}

    def _run(
        self, last_tokens: np.ndarray, top_k: int, wanted: np.ndarray | None = None
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        feeds: dict[str, Tensor] = {
            INPUT_IDS: np.ascontiguousarray(last_tokens, dtype=np.int64)[:, None],
            SOURCE_MASK: self._table_mask,
            **self._memory,
            MEMORY_ROWS: self._row_sentence,
            **self._past,
            BEAM_ROWS: self._beam_rows,
            TOP_K: self._top_k.setdefault(top_k, np.array([top_k], dtype=np.int64)),
            POSITIONS: self._positions,
        }
        log_probs, attn, self._past = self.backend.step(feeds, self.with_attention, wanted, self._bound)
        self._beam_rows = np.arange(len(self._positions), dtype=np.int64)  # the present is in row order
        self._past_len += 1
        self._positions = self._positions + 1
        return log_probs, attn

    def reorder(self, rows: np.ndarray) -> None:
        """No cache moves: the next step's graph gathers the past at the composed ``beam_rows``."""
        if len(rows) == len(self._row_sentence) and np.array_equal(rows, np.arange(len(rows))):
            return
        self._positions = self._positions[rows]
        self._row_sentence = self._row_sentence[rows]
        self._beam_rows = self._beam_rows[rows]
        if self._past_len == 0 or not len(rows):
            self._past_len = 0
            self._past = self._empty_cache()
            self._beam_rows = np.zeros(len(rows), dtype=np.int64)
        elif self.joins_midway:
            # Columns older than the longest remaining history are padding for every row: cut.
            cut = self._past_len - int(self._positions.max())
            if cut:  # host arrays: the live rows' columns, in row order
                live = self._beam_rows
                self._past = {name: np.take(x[..., cut:, :], live, 0) for name, x in self._past.items()}
                self._beam_rows = np.arange(len(rows), dtype=np.int64)
                self._past_len -= cut


def _join_memory(
    table: tuple[Tensor, Tensor], table_mask: np.ndarray, memory: tuple[Tensor, Tensor], mask: np.ndarray
) -> tuple[tuple[Tensor, Tensor], np.ndarray]:
    """Two sentence tables as one, the shorter sources padded (masked) to the longer: host
    arrays, each written once into its place."""
    n, width = table_mask.shape[0], max(table_mask.shape[1], mask.shape[1])

    def joined(old: np.ndarray, new: np.ndarray) -> np.ndarray:  # (layers, sentences, heads, S, d)
        out = np.zeros((old.shape[0], n + new.shape[1], old.shape[2], width, old.shape[4]), dtype=old.dtype)
        out[:, :n, :, : old.shape[3]] = old
        out[:, n:, :, : new.shape[3]] = new
        return out

    keys, values = (joined(np.asarray(t), np.asarray(m)) for t, m in zip(table, memory, strict=True))
    out_mask = np.zeros((n + mask.shape[0], width), dtype=table_mask.dtype)
    out_mask[:n, : table_mask.shape[1]] = table_mask
    out_mask[n:, : mask.shape[1]] = mask
    return (keys, values), out_mask
