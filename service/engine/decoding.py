"""The decoder side of translation: where the memory and the key/value cache live (backends)
and the incremental decoders the beam search of ``search.py`` drives.

The decoder's key/value cache lives in a backend:

* ``HostBackend`` (CPU, the tested path): NumPy arrays through ``session.run``; the cache goes
  out as ``present_*`` and comes back as ``past_*``; reordering is ``np.take`` on the caches'
  row axis (per layer in layout ``per_layer_kv_top_k``, where the memory feeds are views of the
  encoder's stacked output; of the stacked (n_layers, rows, heads, len, d_head) caches in the
  older layouts).
* ``DeviceBackend`` (CUDA): IO binding, so ``present_*`` are bound to device memory and fed back
  as the next ``past_*`` without a host round trip; only the token ids, the source mask and the
  (rows, vocab) log-probs cross the bus. Reordering runs a one-node ONNX ``Gather`` on the device
  (``session.DeviceGather``). It is the same decoder code with ``take``/``run`` swapped, and it
  also runs on CPU OrtValues, which is how the tests check it without a GPU.

The default CPU layout, ``per_layer_kv_slots``, has its own decoder (``slots.SlotDecoder``): its
cache stays in preallocated host buffers that the graph writes in place, and its memory in
buffers of one slot per sentence that all the sentence's beams read.

A decoder of layout ``stacked_kv_top_k`` or ``per_layer_kv_top_k`` takes ``top_k`` and returns
each row's 2 × beam best tokens (``search.Candidates``), so only (rows, 2·beam) scores leave the
graph per step; the full (rows, vocab) log-probs are still there for the export's step-by-step
parity checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from service.artefacts import (
    CROSS_ATTENTION,
    INPUT_IDS,
    LOG_PROBS,
    MEMORY_KEYS,
    MEMORY_VALUES,
    PAST_KEYS,
    PAST_VALUES,
    POSITIONS,
    PRESENT_KEYS,
    PRESENT_VALUES,
    SOURCE_MASK,
    TOP_K,
    TOP_LOG_PROBS,
    TOP_TOKENS,
    VOCABULARY,
    DecoderLayout,
    past_of,
    per_layer,
)
from service.engine.search import Candidates
from service.engine.session import DeviceGather

Tensor = Any  # np.ndarray on the host backend, ort.OrtValue on the device backend


# --- backends: where the memory and the cache live -----------------------------------------------


class Backend(Protocol):
    def encode(self, input_ids: np.ndarray) -> tuple[Tensor, Tensor]:
        """(B, S) ids → memory keys, values (n_layers, B, heads, S, d_head)."""
        ...

    def take(self, x: Tensor, rows: np.ndarray, axis: int) -> Tensor: ...

    layout: DecoderLayout  # the decoder graph's I/O (manifest translation.decoder_layout)

    def layer(self, x: Tensor, i: int) -> Tensor:
        """Layer ``i`` of a stacked (n_layers, …) tensor."""
        ...

    def step(
        self, feeds: dict[str, Tensor], with_attention: bool
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None, dict[str, Tensor]]:
        """One decoder step → log-probs (N, V) (or ``Candidates`` when ``feeds`` set ``top_k``),
        cross-attention (N, S) or None, and the next step's cache feeds (``past_*`` names)."""
        ...


class HostBackend:
    """NumPy in, NumPy out: ``session.run`` copies nothing that matters on a CPU."""

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        layout: DecoderLayout = "stacked_kv",
    ) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self.layout = layout
        # the decoder is decoder_shortlist.onnx (export/graphs/shortlist.py): it steps over shortlists
        self.shortlisted = any(i.name == VOCABULARY for i in decoder.get_inputs())
        self._presents = _present_outputs(decoder)

    def encode(self, input_ids: np.ndarray) -> tuple[Tensor, Tensor]:
        keys, values = self.encoder.run([MEMORY_KEYS, MEMORY_VALUES], {INPUT_IDS: input_ids})
        return keys, values

    def take(self, x: Tensor, rows: np.ndarray, axis: int) -> Tensor:
        return np.take(x, rows, axis=axis)

    def layer(self, x: Tensor, i: int) -> Tensor:
        return x[i]  # a view: a stacked array's layer is contiguous

    def step(
        self, feeds: dict[str, Tensor], with_attention: bool
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None, dict[str, Tensor]]:
        scores = _score_outputs(feeds)
        names = [*scores, *self._presents] + ([CROSS_ATTENTION] if with_attention else [])
        out = dict(zip(names, self.decoder.run(names, feeds), strict=True))
        attn = np.asarray(out[CROSS_ATTENTION], dtype=np.float32) if with_attention else None
        return _scores(out), attn, _next_past(out)


class DeviceBackend:
    """IO binding: memory and cache stay as OrtValues on ``device``; NumPy inputs are copied in."""

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        gather: DeviceGather,
        device: str,
        device_id: int = 0,
        layout: DecoderLayout = "stacked_kv",
    ) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self.layout = layout
        self._presents = _present_outputs(decoder)
        self.gather = gather
        self.device = device
        self.device_id = device_id

    def encode(self, input_ids: np.ndarray) -> tuple[Tensor, Tensor]:
        binding = self.encoder.io_binding()
        binding.bind_cpu_input(INPUT_IDS, input_ids)
        binding.bind_output(MEMORY_KEYS, self.device, self.device_id)
        binding.bind_output(MEMORY_VALUES, self.device, self.device_id)
        self.encoder.run_with_iobinding(binding)
        keys, values = binding.get_outputs()
        return keys, values

    def take(self, x: Tensor, rows: np.ndarray, axis: int) -> Tensor:
        if isinstance(x, np.ndarray):  # the empty first-step cache is a host array
            return np.take(x, rows, axis=axis)
        return self.gather(x, rows, axis)

    def layer(self, x: Tensor, i: int) -> Tensor:
        return x[i] if isinstance(x, np.ndarray) else self.gather(x, np.array(i, dtype=np.int64), 0)

    def step(
        self, feeds: dict[str, Tensor], with_attention: bool
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None, dict[str, Tensor]]:
        binding = self.decoder.io_binding()
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            else:
                binding.bind_ortvalue_input(name, value)
        scores = _score_outputs(feeds)
        on_host = [*scores, CROSS_ATTENTION] if with_attention else scores
        for name in on_host:
            binding.bind_output(name, "cpu")
        for name in self._presents:
            binding.bind_output(name, self.device, self.device_id)
        self.decoder.run_with_iobinding(binding)
        values = binding.get_outputs()  # in binding order
        host = {name: values[i].numpy() for i, name in enumerate(on_host)}
        attn = np.asarray(host[CROSS_ATTENTION], dtype=np.float32) if with_attention else None
        presents = dict(zip(self._presents, values[len(on_host) :], strict=True))
        return _scores(host), attn, _next_past(presents)


def _score_outputs(feeds: dict[str, Tensor]) -> list[str]:
    """The decoder outputs the search reads: the candidates when ``top_k`` asks for some, else
    the full log-probs (``top_k`` 0: a step-by-step comparison with a reference)."""
    return [TOP_LOG_PROBS, TOP_TOKENS] if TOP_K in feeds and feeds[TOP_K][0] > 0 else [LOG_PROBS]


def _next_past(outputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """``present_*`` outputs renamed to the ``past_*`` inputs they feed next step."""
    return {past_of(name): x for name, x in outputs.items() if name.startswith(_PRESENTS)}


_PRESENTS = (PRESENT_KEYS, PRESENT_VALUES)


def _present_outputs(decoder: ort.InferenceSession) -> list[str]:
    return [o.name for o in decoder.get_outputs() if o.name.startswith(_PRESENTS)]


def _scores(out: dict[str, Any]) -> np.ndarray | Candidates:
    if TOP_TOKENS in out:
        return Candidates(np.asarray(out[TOP_LOG_PROBS], dtype=np.float32), np.asarray(out[TOP_TOKENS]))
    return np.asarray(out[LOG_PROBS], dtype=np.float32)


# --- the incremental decoder the search drives -----------------------------------------------------


class Stepping:
    """``step`` (full log-probs) and ``step_candidates`` (each row's ``n`` best tokens from the
    graph's ``TopK``) of a decoder, over its one ``_run(last_tokens, top_k)``."""

    def _run(self, last_tokens: np.ndarray, top_k: int) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        raise NotImplementedError

    def reserve(self, rows: int, sentences: int, source_len: int) -> None:
        """Room for ``rows`` rows of ``sentences`` sentences and sources of ``source_len`` tokens
        before several admissions in a row; a decoder that grows by concatenating needs none."""

    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        scores, attn = self._run(last_tokens, 0)
        assert isinstance(scores, np.ndarray)
        return scores, attn

    def step_candidates(self, last_tokens: np.ndarray, n: int) -> tuple[Candidates, np.ndarray | None]:
        scores, attn = self._run(last_tokens, n)
        assert isinstance(scores, Candidates)
        return scores, attn


class OnnxDecoder(Stepping):
    """``search.IncrementalDecoder`` over ``decoder.onnx``, holding the self-attention cache.

    Rows belong to sentences. The cross-attention memory depends only on a row's *sentence*, so
    it is kept once per sentence (the table) and gathered into the rows' feeds only when the
    row → sentence map changes (start of a beam, sentences finishing or joining), not on every
    beam reorder. ``step`` returns the full log-probs, ``step_candidates`` each row's best tokens
    from the graph's ``TopK``.

    With layout ``per_layer_kv_positions`` on the host backend, sentences may join between steps
    (``admit``): their rows are appended with an empty cache, left-padded to the running length
    and masked by their own ``positions``; the cache is cut back to the longest row's history
    when the rows that made it long have left. Otherwise ``admit`` needs an empty decoder.
    """

    def __init__(
        self,
        backend: Backend,
        memory: tuple[Tensor, Tensor] | None,
        source_mask: np.ndarray | None,
        cache_shape: tuple[int, int, int],
        cache_dtype: type[np.generic],
        with_attention: bool,
    ) -> None:
        self.backend = backend
        self.with_attention = with_attention
        self._cache_shape = cache_shape  # (n_layers, heads, d_head)
        self._cache_dtype = cache_dtype
        self._per_layer = backend.layout in ("per_layer_kv_top_k", "per_layer_kv_positions")
        self._has_positions = backend.layout == "per_layer_kv_positions"
        # Joining needs host arrays to pad and concatenate (the device backend only gathers).
        self.joins_midway = self._has_positions and isinstance(backend, HostBackend)
        self._takes_top_k = backend.layout != "stacked_kv"
        self._cache_axis = 0 if self._per_layer else 1  # the rows axis of each cache feed
        self._table: tuple[Tensor, Tensor] | None = None  # memory K/V per sentence
        self._table_mask = np.zeros((0, 0), dtype=np.int64)  # (sentences, S) source masks
        self._row_sentence = np.zeros(0, dtype=np.int64)
        self._positions = np.zeros(0, dtype=np.int64)  # tokens each row has decoded
        self._memory: dict[str, Tensor] = {}
        self._mask = self._table_mask
        self._past = self._empty_cache(0, 0)
        self._past_len = 0
        if memory is not None and source_mask is not None:
            self.admit(memory, source_mask, [1] * source_mask.shape[0])

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

    def admit(self, memory: tuple[Tensor, Tensor], source_mask: np.ndarray, repeats: Sequence[int]) -> None:
        """New sentences, from one encoder call ((n_layers, n, heads, S, d_head) K/V and their
        (n, S) mask): sentence i gets ``repeats[i]`` rows after the running ones."""
        if self.rows and not self.joins_midway:
            raise RuntimeError(
                f"decoder layout {self.backend.layout!r} here cannot admit rows into a running decode"
            )
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
        # The new rows' cache is empty: zeros, all masked by their position 0.
        self._past = {name: _grown(x, self._cache_axis, len(new_rows)) for name, x in self._past.items()}
        self._gather_memory()

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

    def _gather_memory(self) -> None:
        assert self._table is not None
        keys, values = self._table
        rows = self._row_sentence
        self._memory = self._memory_feeds(
            (self.backend.take(keys, rows, 1), self.backend.take(values, rows, 1))
        )
        self._mask = self._table_mask[rows]

    def _memory_feeds(self, memory: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        """The decoder's memory inputs: the stacked K/V, or each layer's (host: views)."""
        names = (MEMORY_KEYS, MEMORY_VALUES)
        if not self._per_layer:
            return dict(zip(names, memory, strict=True))
        layers = self._cache_shape[0]
        return {
            per_layer(name, i): self.backend.layer(x, i)
            for name, x in zip(names, memory, strict=True)
            for i in range(layers)
        }

    def _empty_cache(self, rows: int, length: int) -> dict[str, Tensor]:
        layers, heads, d_head = self._cache_shape
        if not self._per_layer:
            empty = np.zeros((layers, rows, heads, length, d_head), dtype=self._cache_dtype)
            return {PAST_KEYS: empty, PAST_VALUES: empty}
        empty = np.zeros((rows, heads, length, d_head), dtype=self._cache_dtype)
        return {per_layer(name, i): empty for name in (PAST_KEYS, PAST_VALUES) for i in range(layers)}

    def _run(self, last_tokens: np.ndarray, top_k: int) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        feeds: dict[str, Tensor] = {
            INPUT_IDS: np.ascontiguousarray(last_tokens, dtype=np.int64)[:, None],
            SOURCE_MASK: self._mask,
            **self._memory,
            **self._past,
        }
        if self._takes_top_k:
            feeds[TOP_K] = np.array([top_k], dtype=np.int64)
        if self._has_positions:
            feeds[POSITIONS] = self._positions
        log_probs, attn, self._past = self.backend.step(feeds, self.with_attention)
        self._past_len += 1
        self._positions = self._positions + 1
        return log_probs, attn

    def reorder(self, rows: np.ndarray) -> None:
        if len(rows) == len(self._row_sentence) and np.array_equal(rows, np.arange(len(rows))):
            return
        self._positions = self._positions[rows]
        if self._past_len == 0 or not len(rows):
            self._past_len = 0
            self._past = self._empty_cache(len(rows), 0)
        else:
            # Columns older than the longest remaining history are padding for every row: cut.
            cut = self._past_len - int(self._positions.max()) if self.joins_midway else 0
            self._past = {
                name: self.backend.take(x[..., cut:, :] if cut else x, rows, self._cache_axis)
                for name, x in self._past.items()
            }
            self._past_len -= cut
        sentences = self._row_sentence[rows]
        if not np.array_equal(sentences, self._row_sentence):
            self._row_sentence = sentences
            if len(rows):
                self._gather_memory()


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


def _grown(x: Tensor, axis: int, n: int) -> np.ndarray:
    """Host array ``x`` with ``n`` zero entries appended along ``axis``: one allocation, one copy."""
    x = np.asarray(x)
    shape = list(x.shape)
    shape[axis] += n
    out = np.zeros(shape, dtype=x.dtype)
    out[(slice(None),) * axis + (slice(0, x.shape[axis]),)] = x
    return out
