"""The decoder of layout ``per_layer_kv_slots``: every running row owns a slot of preallocated
cache buffers, every running sentence one of memory buffers, and nothing that stays put is ever
copied.

Per decoder layer the row slots are the self-attention cache K, V (rows, heads, cache_len,
d_head), whose first ``positions[r]`` columns are row r's history; the sentence slots are the
cross-attention memory K, V (sentences, heads, source_len, d_head) with the source mask, held
once for all of a sentence's beams. The running rows are the first ``rows`` row slots and the
running sentences the first ``sentences`` memory slots, so every feed is a contiguous prefix
view; ``sentence_rows`` and ``beam_index`` tell the graph which rows fold onto which memory
(export/sources/cached_attention.py). A step binds each cache buffer as both the graph's ``cache_*``
input and its ``present_*`` output: onnxruntime's GroupQueryAttention writes the new column in
place.

Between steps (``search.IncrementalDecoder.reorder``) a row that keeps its place costs nothing;
a row that takes another row's history (a beam that wins twice, a sentence moved into the place
of one that left) gets that row's cache columns from the first one that differs: every column a
step computes gets an id (``_lineage``), copied with it, so two beams of one sentence that share
their first tokens hold the very same columns for them and only the later ones move. Joining
writes each new sentence's memory once; when a sentence leaves, the last memory slot moves into
its place. Buffers grow (amortised) when rows, sentences, source width or history outgrow them
and are let go when the decode empties.

With a vocabulary shortlist (the backend's decoder is decoder_shortlist.onnx, export/graphs/shortlist.py)
every sentence joins with its own list of target ids; a step feeds their union and each row's mask
over it, which change only when sentences join or leave (``shortlist.StepVocabulary``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from service.artefacts import (
    BEAM_INDEX,
    CACHE_KEYS,
    CACHE_VALUES,
    CROSS_ATTENTION,
    INPUT_IDS,
    LOG_PROBS,
    MEMORY_KEYS,
    MEMORY_VALUES,
    POSITIONS,
    PRESENT_KEYS,
    PRESENT_VALUES,
    SENTENCE_ROWS,
    SOURCE_MASK,
    TOP_K,
    TOP_LOG_PROBS,
    TOP_TOKENS,
    VOCABULARY,
    VOCABULARY_MASK,
    per_layer,
)
from service.engine.translation.candidates import Candidates
from service.engine.translation.decoding import (
    Decoder,
    Tensor,
    candidate_log_probs,
    score_dtypes,
    wanted_log_probs,
)
from service.engine.translation.folding import fold_beams
from service.engine.translation.shortlist import StepVocabulary

_FIRST_CACHE_LEN = 16  # columns a fresh cache holds before it first grows
_FEW_MOVED = 4  # rows a reorder moves one by one (more: in one gather and scatter)


class SlotDecoder(Decoder):
    """``search.IncrementalDecoder`` over a ``per_layer_kv_slots`` decoder, host buffers in place."""

    memory_per_sentence = True
    steps_over_shortlists = True
    cache_on_host = True
    resumes = True

    def _start(self) -> None:
        self._layers, self._heads, self._d_head = self._cache_shape
        self._dtype = self._cache_dtype
        # the decoder is decoder_shortlist.onnx (export/graphs/shortlist.py): it steps over shortlists
        self._shortlisted = any(i.name == VOCABULARY for i in self.backend.decoder.get_inputs())
        self._rows, self._sentences, self._next_sentence = 0, 0, 0  # rows, memory slots in use
        self._binding: ort.IOBinding | None = None  # dropped whenever a buffer is replaced
        # (rows, top_k, full log-probs, attention) it was made for
        self._bound: tuple[int, int, bool, bool] | None = None
        self._outputs: dict[str, np.ndarray] = {}  # the binding's output arrays, by name
        self._last = np.zeros((0, 1), dtype=np.int64)  # each row's last token: the binding's input_ids
        self._top_k = np.zeros(1, dtype=np.int64)
        self._output_dtypes, self._vocab = score_dtypes(self.backend.decoder, self._shortlisted)
        self._cache = self._buffers(0, 0)
        self._release()

    @property
    def joins_midway(self) -> bool:
        return True

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def sentences(self) -> int:
        return self._sentences

    @property
    def source_len(self) -> int:
        return self._mask.shape[1]

    @property
    def nbytes(self) -> int:
        """What the slot buffers hold now (cache, memory, masks)."""
        return self._cache.nbytes + self._memory.nbytes + self._mask.nbytes

    def _release(self) -> None:
        """Empty buffers: an idle decode holds no memory (its cache goes to the engine's spare)."""
        self._binding = None
        if self._spare is not None:  # it keeps only buffers that hold something
            self._spare.give(self._cache)
        self._cache = self._buffers(0, 0)  # row slots
        self._memory = self._buffers(0, 0)  # sentence slots
        self._mask = np.zeros((0, 0), dtype=np.int64)  # (sentence slots, S)
        self._positions = np.zeros(0, dtype=np.int64)  # tokens each row has decoded
        # (row slots, cache columns): which step's computation each column of a slot holds
        # (-1: zeros), so that a reorder copies only the columns that differ
        self._lineage = np.full((0, 0), -1, dtype=np.int64)
        self._next_column = 0  # the next id ``_lineage`` gives
        self._sentence = np.zeros(0, dtype=np.int64)  # which sentence a row decodes
        self._held = np.zeros(0, dtype=np.int64)  # which sentence a memory slot holds
        self._fold: tuple[np.ndarray, np.ndarray] | None = None  # (sentence_rows, beam_index)
        self._shortlists = StepVocabulary() if self._shortlisted else None

    def _buffers(self, slots: int, length: int) -> np.ndarray:
        """Keys then values, per layer, in one block (2 × layers, slots, heads, length, d_head):
        each layer's buffer is a contiguous block of it, and a reorder moves a row's columns in
        every layer in one indexing, not one per layer."""
        return np.zeros((2 * self._layers, slots, self._heads, length, self._d_head), dtype=self._dtype)

    def reserve(self, rows: int, sentences: int, source_len: int) -> None:
        self._reserve(rows, sentences, source_len, 1)

    def _reserve(self, rows: int, sentences: int, source_len: int, cache_len: int) -> None:
        """Grow the buffers to hold ``rows`` row slots, ``sentences`` memory slots, sources of
        ``source_len`` tokens and ``cache_len`` columns of history, keeping what runs."""
        have_rows, have_sentences, have_cache = len(self._positions), len(self._held), self._cache[0].shape[2]
        new_rows, new_sentences = _grown(rows, have_rows), _grown(sentences, have_sentences)
        wider, longer = source_len > self.source_len, cache_len > have_cache
        if new_rows > have_rows or new_sentences > have_sentences or wider or longer:
            self._binding = None  # it holds the buffers replaced below: let them go now
        if new_rows > have_rows or longer:
            length = max(cache_len, 2 * have_cache, _FIRST_CACHE_LEN) if longer else have_cache
            spare = self._spare.take(new_rows, length) if self._spare is not None else None
            self._cache = self._regrown(self._cache, new_rows, length, self._rows, spare)
            new_rows, length = self._cache[0].shape[0], self._cache[0].shape[2]  # a spare may hold more
            lineage = np.full((new_rows, length), -1, dtype=np.int64)
            lineage[: self._rows, : self._lineage.shape[1]] = self._lineage[: self._rows]
            self._lineage = lineage
        if new_sentences > have_sentences or wider:
            width = max(source_len, self.source_len)
            self._memory = self._regrown(self._memory, new_sentences, width, self._sentences)
            mask = np.zeros((new_sentences, width), dtype=np.int64)
            mask[: self._sentences, : self.source_len] = self._mask[: self._sentences]
            self._mask = mask
        if new_rows > have_rows:
            self._last = np.zeros((new_rows, 1), dtype=np.int64)  # written afresh every step
            self._positions = np.concatenate([self._positions, np.zeros(new_rows - have_rows, np.int64)])
            self._sentence = np.concatenate([self._sentence, np.full(new_rows - have_rows, -1)])
        if new_sentences > have_sentences:
            self._held = np.concatenate([self._held, np.full(new_sentences - have_sentences, -1)])

    def _regrown(
        self,
        buffers: np.ndarray,
        slots: int,
        length: int,
        keep: int,
        spare: np.ndarray | None = None,
    ) -> np.ndarray:
        """``buffers``' first ``keep`` slots in ``spare`` or in new buffers of that size."""
        grown = self._buffers(slots, length) if spare is None else spare
        grown[:, :keep, :, : buffers.shape[3]] = buffers[:, :keep]
        return grown

    def admit(
        self,
        memory: tuple[Tensor, Tensor],
        source_mask: np.ndarray,
        repeats: Sequence[int],
        shortlists: Sequence[np.ndarray] | None = None,
    ) -> None:
        """Sentence i also gets a memory slot, written once."""
        if self._shortlists is not None:
            if shortlists is None or len(shortlists) != len(repeats):
                raise ValueError("this decoder steps over shortlists: every sentence needs one")
            for i, ids in enumerate(shortlists):
                self._shortlists.add(self._next_sentence + i, ids)
        keys, values = (np.asarray(x) for x in memory)
        ids = self._next_sentence + np.arange(len(repeats))
        rows, width = self._rows, source_mask.shape[1]  # an empty decode holds no buffers (reorder)
        new = slice(self._sentences, self._sentences + len(repeats))
        self._reserve(rows + sum(repeats), new.stop, width, 1)
        self._memory[: self._layers, new, :, :width] = keys
        self._memory[self._layers :, new, :, :width] = values
        self._mask[new] = 0
        self._mask[new, :width] = source_mask
        self._held[new] = ids
        self._sentences = new.stop
        new_rows = slice(rows, rows + sum(repeats))
        self._positions[new_rows] = 0
        self._sentence[new_rows] = np.repeat(ids, repeats)
        self._next_sentence += len(repeats)
        self._rows = new_rows.stop
        self._fold = None

    def park(self, row: int, columns: int) -> np.ndarray:
        return self._cache[:, row, :, :columns].copy()

    def resume(self, row: int, history: np.ndarray) -> None:
        columns = history.shape[2]
        self._reserve(self._rows, 0, 0, columns)
        self._cache[:, row, :, :columns] = history
        self._lineage[row, :columns] = self._next_column + np.arange(columns)  # no other row's ids
        self._next_column += columns
        self._positions[row] = columns

    def _run(
        self, last_tokens: np.ndarray, top_k: int, wanted: np.ndarray | None = None
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        n = self._rows
        self._reserve(n, 0, 0, int(self._positions[:n].max()) + 1)
        if self._shortlists is not None:
            if not top_k:
                raise ValueError("a shortlist step gives each row's candidates only (top_k > 0)")
            if self._shortlists.update(self._sentence[:n]):
                self._binding = None  # it holds the arrays replaced
            top_k = min(top_k, len(self._shortlists.vocabulary))
            if wanted is not None:  # every shortlist token ranked: the wanted ones among them
                return self._run_ranking_all(last_tokens, top_k, wanted)
        if self._fold is None:
            self._fold = fold_beams(self._sentence[:n], self._held[: self._sentences])
            self._binding = None  # it holds the arrays replaced
        full = not top_k or wanted is not None  # the step's full log-probs come out
        binding = self._binding_for(n, top_k, full)
        self._last[:n, 0] = last_tokens
        self.backend.decoder.run_with_iobinding(binding)
        self._lineage[np.arange(n), self._positions[:n]] = self._next_column + np.arange(n)
        self._next_column += n
        self._positions[:n] += 1
        attn = self._outputs[CROSS_ATTENTION].copy() if self.with_attention else None
        if not top_k:
            return self._outputs[LOG_PROBS].copy(), attn  # the next step reuses the arrays
        chosen = None if wanted is None else wanted_log_probs(self._outputs[LOG_PROBS], wanted)
        return Candidates(self._outputs[TOP_LOG_PROBS].copy(), self._outputs[TOP_TOKENS].copy(), chosen), attn

    def _run_ranking_all(
        self, last_tokens: np.ndarray, top_k: int, wanted: np.ndarray
    ) -> tuple[Candidates, np.ndarray | None]:
        """A shortlist step with ``wanted`` tokens: onnxruntime will not hand out the shortlist
        graph's ``log_probs`` (it infers them as wide as the whole vocabulary), so the step ranks
        every shortlist token and the wanted ones' scores are read from those candidates."""
        assert self._shortlists is not None
        ranked, attn = self._run(last_tokens, len(self._shortlists.vocabulary))
        assert isinstance(ranked, Candidates)
        chosen = candidate_log_probs(ranked, wanted)
        return Candidates(ranked.log_probs[:, :top_k], ranked.tokens[:, :top_k], chosen), attn

    def _wanted(self, top_k: int, full: bool) -> list[str]:
        scores = [TOP_LOG_PROBS, TOP_TOKENS] if top_k else []
        scores += [LOG_PROBS] if full else []
        return [*scores, CROSS_ATTENTION] if self.with_attention else scores

    def _binding_for(self, n: int, top_k: int, full: bool) -> ort.IOBinding:
        """The step's IO binding. Every input and output is bound to an array of this decoder:
        tokens, positions, masks, memory and cache as views of the slot buffers, which the steps
        and ``reorder`` change in place, the outputs to arrays made with the binding. So one
        binding serves every step until the rows, ``top_k``, the attention output or a buffer
        change, and a step binds nothing: binding per step would cost every step of every decode
        what only a change of rows or buffers needs."""
        key = (n, top_k, full, self.with_attention)
        if self._binding is not None and self._bound == key:
            return self._binding
        assert self._fold is not None
        layers, sentences = self._layers, self._sentences
        binding = self.backend.decoder.io_binding()
        self._top_k[0] = top_k
        if self._shortlists is not None:
            binding.bind_cpu_input(VOCABULARY, self._shortlists.vocabulary)
            binding.bind_cpu_input(VOCABULARY_MASK, self._shortlists.mask)
        binding.bind_cpu_input(INPUT_IDS, self._last[:n])
        binding.bind_cpu_input(TOP_K, self._top_k)
        binding.bind_cpu_input(POSITIONS, self._positions[:n])
        binding.bind_cpu_input(SOURCE_MASK, self._mask[:sentences])
        binding.bind_cpu_input(SENTENCE_ROWS, self._fold[0])
        binding.bind_cpu_input(BEAM_INDEX, self._fold[1])
        for j, name in enumerate((MEMORY_KEYS, MEMORY_VALUES)):
            for i in range(layers):
                binding.bind_cpu_input(per_layer(name, i), self._memory[j * layers + i][:sentences])
        self._outputs = {}
        for name in self._wanted(top_k, full):
            width = {LOG_PROBS: self._vocab, CROSS_ATTENTION: self.source_len}.get(name, top_k)
            out = self._outputs[name] = np.empty((n, width), dtype=self._output_dtypes[name])
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(out))
        for j, (cache, present) in enumerate(((CACHE_KEYS, PRESENT_KEYS), (CACHE_VALUES, PRESENT_VALUES))):
            for i in range(layers):
                slot = ort.OrtValue.ortvalue_from_numpy(self._cache[j * layers + i][:n])
                binding.bind_ortvalue_input(per_layer(cache, i), slot)
                binding.bind_ortvalue_output(per_layer(present, i), slot)  # the same memory: in place
        self._binding, self._bound = binding, key
        return binding

    def reorder(self, rows: np.ndarray) -> None:
        """Row i takes row ``rows[i]``'s history: only the rows that change move; memory slots
        move only when sentences leave."""
        if not len(rows):
            self._rows = self._sentences = 0
            self._release()
            return
        self._reserve(len(rows), 0, 0, 0)
        moved = np.flatnonzero(rows != np.arange(len(rows)))
        regrouped = len(rows) != self._rows
        if len(moved):
            src = rows[moved]
            self._copy_history(moved, src)
            regrouped = regrouped or bool(np.any(self._sentence[src] != self._sentence[moved]))
            self._positions[moved] = self._positions[src]
            self._sentence[moved] = self._sentence[src]
        self._rows = len(rows)
        if regrouped:
            self._drop_left_sentences()
            self._fold = None

    def _copy_history(self, moved: np.ndarray, src: np.ndarray) -> None:
        """Row ``moved[i]`` takes row ``src[i]``'s history: its columns from the first whose
        computation differs (``_lineage``) to the last the source holds, in one gather and one
        scatter (the source columns are read before any is written: a row may be both). Beams of
        one step mostly differ in their last column; a sentence moved into the place of one that
        left, in all of its few."""
        if len(moved) <= _FEW_MOVED:
            self._copy_few(moved.tolist(), src.tolist())
            return
        length = int(self._positions[src].max())
        if not length:
            return
        differs = self._lineage[moved, :length] != self._lineage[src, :length]
        first = np.where(differs.any(axis=1), differs.argmax(axis=1), length)
        which, columns = copied_columns(first, self._positions[src])
        to_rows, from_rows = moved[which], src[which]
        self._cache[:, to_rows, :, columns] = self._cache[:, from_rows, :, columns]
        self._lineage[to_rows, columns] = self._lineage[from_rows, columns]

    def _copy_few(self, moved: list[int], src: list[int]) -> None:
        """``_copy_history`` row by row (a one-sentence step moves one or two rows): a few small
        operations a row, not the whole-array path's score. Sources are read before any write."""
        apart = self._differing(moved, src)
        pieces = [(self._cache[:, r, :, a:b].copy(), self._lineage[r, a:b].copy()) for _, r, a, b in apart]
        for (to, _, a, b), (columns, ids) in zip(apart, pieces, strict=True):
            self._cache[:, to, :, a:b], self._lineage[to, a:b] = columns, ids

    def _differing(self, moved: list[int], src: list[int]) -> list[tuple[int, int, int, int]]:
        """(row, its source, the first column computed apart, the source's end) for each row
        whose history differs from its source's."""
        apart = []
        for to, origin in zip(moved, src, strict=True):
            end = int(self._positions[origin])
            differs = self._lineage[to, :end] != self._lineage[origin, :end]
            if differs.any():
                apart.append((to, origin, int(differs.argmax()), end))
        return apart

    def _drop_left_sentences(self) -> None:
        """Free the memory slots of sentences no row decodes any more: the last slots in use move
        into the gaps, so the running sentences stay a prefix."""
        held = self._held[: self._sentences]
        going = ~np.isin(held, self._sentence[: self._rows])
        if not going.any():
            return
        keep = self._sentences - int(going.sum())
        gaps, last = np.flatnonzero(going[:keep]), np.flatnonzero(~going[keep:]) + keep
        if len(gaps):
            self._memory[:, gaps] = self._memory[:, last]
            self._mask[gaps] = self._mask[last]
            self._held[gaps] = self._held[last]
        self._sentences = keep


def copied_columns(first: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row i's columns ``first[i]`` … ``end[i] - 1``, all rows' in order, as (i, column) pairs."""
    counts = np.maximum(end - first, 0)
    which = np.repeat(np.arange(len(first)), counts)
    columns = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + first[which]
    return which, columns


def _grown(wanted: int, have: int) -> int:
    """Slots to allocate for ``wanted``: at least half as many again as ``have`` (amortised)."""
    return max(wanted, have * 3 // 2) if wanted > have else have
