"""The decoder of layout ``per_layer_kv_slots``: every running row owns a slot of preallocated
buffers, and nothing that stays put is ever copied.

Per decoder layer the slot buffers are the self-attention cache K, V (rows, heads, cache_len,
d_head), whose first ``positions[r]`` columns are row r's history, and the cross-attention
memory K, V (rows, heads, source_len, d_head) of row r's sentence, with its source mask. The
running rows are the first ``rows`` slots, so every feed is a contiguous prefix view. A step
binds each cache buffer as both the graph's ``cache_*`` input and its ``present_*`` output:
onnxruntime's GroupQueryAttention writes the new column in place (export/cached_attention.py).

Between steps (``search.IncrementalDecoder.reorder``) a row that keeps its place costs nothing;
a row that takes another row's history (a beam that wins twice, a sentence moved into the place
of one that left) gets that row's cache columns so far, and its memory only when the other row
decodes a different sentence. Joining writes the new rows' memory once; buffers grow (amortised)
when rows, source width or history outgrow them and are let go when the decode empties.

With a vocabulary shortlist (a ``shortlisted`` backend's decoder, export/shortlist.py) every
sentence joins with its own list of target ids; a step feeds their union and each row's mask
over it, which change only when sentences join or leave (``shortlist.StepVocabulary``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from service.artefacts import (
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
    SOURCE_MASK,
    TOP_K,
    TOP_LOG_PROBS,
    TOP_TOKENS,
    VOCABULARY,
    VOCABULARY_MASK,
    ArtefactError,
    per_layer,
)
from service.engine.decoding import Backend, HostBackend, OnnxDecoder, Stepping, Tensor
from service.engine.search import Candidates
from service.engine.session import ELEMENT_NUMPY
from service.engine.shortlist import StepVocabulary

SLOTS_LAYOUT = "per_layer_kv_slots"
_FIRST_CACHE_LEN = 16  # columns a fresh cache holds before it first grows


class SlotDecoder(Stepping):
    """``search.IncrementalDecoder`` over a ``per_layer_kv_slots`` decoder, host buffers in place."""

    joins_midway = True

    def __init__(
        self,
        backend: HostBackend,
        memory: tuple[Tensor, Tensor] | None,
        source_mask: np.ndarray | None,
        cache_shape: tuple[int, int, int],
        cache_dtype: type[np.generic],
        with_attention: bool,
    ) -> None:
        self.backend = backend
        self.with_attention = with_attention
        self._layers, self._heads, self._d_head = cache_shape
        self._dtype = cache_dtype
        self._rows = 0
        self._next_sentence = 0
        self._binding: ort.IOBinding | None = None  # dropped whenever a buffer is replaced
        self._bound: tuple[int, int, bool] | None = None  # (rows, top_k, attention) it was made for
        self._outputs: dict[str, np.ndarray] = {}  # the binding's output arrays, by name
        self._last = np.zeros((0, 1), dtype=np.int64)  # each row's last token: the binding's input_ids
        self._top_k = np.zeros(1, dtype=np.int64)
        self._output_dtypes, self._vocab = _score_dtypes(backend.decoder, backend.shortlisted)
        self._release()
        if memory is not None and source_mask is not None:
            self.admit(memory, source_mask, [1] * source_mask.shape[0])

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def source_len(self) -> int:
        return self._mask.shape[1]

    @property
    def nbytes(self) -> int:
        """What the slot buffers hold now (cache, memory, masks)."""
        return sum(b.nbytes for b in (*self._cache, *self._memory, self._mask))

    def _release(self) -> None:
        """Empty buffers: an idle decode holds no memory."""
        self._binding = None
        self._cache = self._buffers(0, 0)  # keys then values, per layer
        self._memory = self._buffers(0, 0)
        self._mask = np.zeros((0, 0), dtype=np.int64)
        self._positions = np.zeros(0, dtype=np.int64)  # tokens each row has decoded
        self._sentence = np.zeros(0, dtype=np.int64)  # which sentence's memory a row holds
        self._shortlists = StepVocabulary() if self.backend.shortlisted else None

    def _buffers(self, rows: int, length: int) -> list[np.ndarray]:
        shape = (rows, self._heads, length, self._d_head)
        return [np.zeros(shape, dtype=self._dtype) for _ in range(2 * self._layers)]

    def reserve(self, rows: int, source_len: int) -> None:
        self._reserve(rows, source_len, 1)

    def _reserve(self, rows: int, source_len: int, cache_len: int) -> None:
        """Grow the buffers to hold ``rows`` slots, sources of ``source_len`` tokens and
        ``cache_len`` columns of history, keeping the running rows' contents."""
        have_rows, have_cache = self._positions.shape[0], self._cache[0].shape[2]
        grow_rows = rows > have_rows
        new_rows = max(rows, have_rows * 3 // 2) if grow_rows else have_rows
        if grow_rows or cache_len > have_cache or source_len > self.source_len:
            self._binding = None  # it holds the buffers replaced below: let them go now
        if grow_rows or cache_len > have_cache:
            length = (
                max(cache_len, 2 * have_cache, _FIRST_CACHE_LEN) if cache_len > have_cache else have_cache
            )
            self._cache = self._regrown(self._cache, new_rows, length)
        if grow_rows or source_len > self.source_len:
            width = max(source_len, self.source_len)
            self._memory = self._regrown(self._memory, new_rows, width)
            mask = np.zeros((new_rows, width), dtype=np.int64)
            mask[: self._rows, : self.source_len] = self._mask[: self._rows]
            self._mask = mask
        if grow_rows:
            self._last = np.zeros((new_rows, 1), dtype=np.int64)  # written afresh every step
            self._positions = np.concatenate([self._positions, np.zeros(new_rows - have_rows, np.int64)])
            self._sentence = np.concatenate([self._sentence, np.full(new_rows - have_rows, -1)])

    def _regrown(self, buffers: list[np.ndarray], rows: int, length: int) -> list[np.ndarray]:
        grown = self._buffers(rows, length)
        for old, new in zip(buffers, grown, strict=True):
            new[: self._rows, :, : old.shape[2]] = old[: self._rows]
        return grown

    def admit(
        self,
        memory: tuple[Tensor, Tensor],
        source_mask: np.ndarray,
        repeats: Sequence[int],
        shortlists: Sequence[np.ndarray] | None = None,
    ) -> None:
        """New sentences, from one encoder call ((n_layers, n, heads, S, d_head) K/V and their
        (n, S) mask): sentence i gets ``repeats[i]`` rows after the running ones (and, with a
        shortlist session, the target ids ``shortlists[i]``)."""
        if self._shortlists is not None:
            if shortlists is None or len(shortlists) != len(repeats):
                raise ValueError("this decoder steps over shortlists: every sentence needs one")
            for i, ids in enumerate(shortlists):
                self._shortlists.add(self._next_sentence + i, ids)
        keys, values = (np.asarray(x) for x in memory)
        sentence = np.repeat(np.arange(len(repeats)), repeats)
        start, width = self._rows, source_mask.shape[1]  # an empty decode holds no buffers (reorder)
        self._reserve(start + len(sentence), width, 1)
        new = slice(start, start + len(sentence))
        for i in range(self._layers):
            self._memory[i][new, :, :width] = keys[i][sentence]
            self._memory[self._layers + i][new, :, :width] = values[i][sentence]
        self._mask[new] = 0
        self._mask[new, :width] = source_mask[sentence]
        self._positions[new] = 0
        self._sentence[new] = self._next_sentence + sentence
        self._next_sentence += len(repeats)
        self._rows = new.stop

    def _run(self, last_tokens: np.ndarray, top_k: int) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        n = self._rows
        self._reserve(n, 0, int(self._positions[:n].max()) + 1)
        if self._shortlists is not None:
            if not top_k:
                raise ValueError("a shortlist step gives each row's candidates only (top_k > 0)")
            if self._shortlists.update(self._sentence[:n]):
                self._binding = None  # it holds the arrays replaced
            top_k = min(top_k, len(self._shortlists.vocabulary))
        binding = self._binding_for(n, top_k)
        self._last[:n, 0] = last_tokens
        self.backend.decoder.run_with_iobinding(binding)
        self._positions[:n] += 1
        out = {name: x.copy() for name, x in self._outputs.items()}  # the next step reuses the arrays
        attn = out[CROSS_ATTENTION] if self.with_attention else None
        if top_k:
            return Candidates(out[TOP_LOG_PROBS], out[TOP_TOKENS]), attn
        return out[LOG_PROBS], attn

    def _wanted(self, top_k: int) -> list[str]:
        scores = [TOP_LOG_PROBS, TOP_TOKENS] if top_k else [LOG_PROBS]
        return [*scores, CROSS_ATTENTION] if self.with_attention else scores

    def _binding_for(self, n: int, top_k: int) -> ort.IOBinding:
        """The step's IO binding. Every input and output is bound to an array of this decoder:
        tokens, positions, mask, memory and cache as views of the slot buffers, which the steps
        and ``reorder`` change in place, the outputs to arrays made with the binding. So one
        binding serves every step until the rows, ``top_k``, the attention output or a buffer
        change, and a step binds nothing (about 0.2 ms of binding a step saved at first; then
        the per-step token, ``top_k`` and output bindings: a short beam-4 request 5 % faster)."""
        key = (n, top_k, self.with_attention)
        if self._binding is not None and self._bound == key:
            return self._binding
        layers = self._layers
        binding = self.backend.decoder.io_binding()
        self._top_k[0] = top_k
        if self._shortlists is not None:
            binding.bind_cpu_input(VOCABULARY, self._shortlists.vocabulary)
            binding.bind_cpu_input(VOCABULARY_MASK, self._shortlists.mask)
        binding.bind_cpu_input(INPUT_IDS, self._last[:n])
        binding.bind_cpu_input(TOP_K, self._top_k)
        binding.bind_cpu_input(POSITIONS, self._positions[:n])
        binding.bind_cpu_input(SOURCE_MASK, self._mask[:n])
        for j, name in enumerate((MEMORY_KEYS, MEMORY_VALUES)):
            for i in range(layers):
                binding.bind_cpu_input(per_layer(name, i), self._memory[j * layers + i][:n])
        self._outputs = {}
        for name in self._wanted(top_k):
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
        """Row i takes row ``rows[i]``'s history (and memory): only the rows that change move."""
        if not len(rows):
            self._rows = 0
            self._release()
            return
        self._reserve(len(rows), 0, 0)
        moved = np.flatnonzero(rows != np.arange(len(rows)))
        if len(moved):
            src = rows[moved]
            length = int(self._positions[src].max())
            if length:
                for buffer in self._cache:  # the right side is gathered first: overlaps are safe
                    buffer[moved, :, :length] = buffer[src, :, :length]
            other = self._sentence[src] != self._sentence[moved]
            if other.any():
                to, src_other = moved[other], src[other]
                for buffer in self._memory:
                    buffer[to] = buffer[src_other]
                self._mask[to] = self._mask[src_other]
            self._positions[moved] = self._positions[src]
            self._sentence[moved] = self._sentence[src]
        self._rows = len(rows)


def _score_dtypes(
    decoder: ort.InferenceSession, shortlisted: bool
) -> tuple[dict[str, type[np.generic]], int]:
    """The dtype of each score and attention output, and the vocabulary (``log_probs``' width;
    0 for a shortlist decoder, whose width is its shortlist's)."""
    outputs = {o.name: o for o in decoder.get_outputs()}
    vocab = 0 if shortlisted else outputs[LOG_PROBS].shape[1]
    if not isinstance(vocab, int):
        raise ArtefactError(f"the decoder's {LOG_PROBS} output has no fixed vocabulary size: {vocab!r}")
    names = (LOG_PROBS, TOP_LOG_PROBS, TOP_TOKENS, CROSS_ATTENTION)
    return {name: ELEMENT_NUMPY[outputs[name].type] for name in names}, vocab


def incremental_decoder(
    backend: Backend,
    memory: tuple[Tensor, Tensor] | None,
    source_mask: np.ndarray | None,
    cache_shape: tuple[int, int, int],
    cache_dtype: type[np.generic],
    with_attention: bool,
) -> OnnxDecoder | SlotDecoder:
    """The decoder for the backend's layout: slots in place, or the concatenating cache."""
    if backend.layout == SLOTS_LAYOUT:
        if not isinstance(backend, HostBackend):
            raise TypeError("layout per_layer_kv_slots keeps its cache in host buffers (HostBackend)")
        return SlotDecoder(backend, memory, source_mask, cache_shape, cache_dtype, with_attention)
    return OnnxDecoder(backend, memory, source_mask, cache_shape, cache_dtype, with_attention)
