"""The decoder side of translation: where the memory and the key/value cache live (backends),
and the interface every layout's incremental decoder gives the search (``Decoder``).

The decoder's key/value cache lives in a backend:

* ``HostBackend`` (CPU, the tested path): NumPy arrays through ``session.run``; the cache goes
  out as ``present_*`` and comes back as ``past_*``, and the memory feeds are views of the
  encoder's stacked output.
* ``DeviceBackend`` (CUDA): IO binding, so ``present_*`` are bound to device memory and fed back
  as the next ``past_*`` without a host round trip; only the token ids, the row indices and each
  row's candidates cross the bus, and the stacked memory is bound layer by layer at its address
  (``LayerView``), never copied. Reordering is the decoder graph's own gather of the past by
  ``beam_rows`` (``positions.PositionsDecoder``): a step is one onnxruntime run. It is the same
  decoder code with ``layers``/``step`` swapped, and it also runs on CPU OrtValues, which is how
  the tests check it without a GPU.

Each decoder layout the export writes has its decoder class, chosen once when the artefact loads
(``layouts.py``): ``slots.SlotDecoder`` (``per_layer_kv_slots``, the CPU variants: its cache in
preallocated host buffers that the graph writes in place) and ``positions.PositionsDecoder``
(``per_layer_kv_positions``, fp16: a growing cache on either backend). Both decoders take
``top_k`` and return each row's 2 × beam best tokens (``search.Candidates``), so only
(rows, 2·beam) scores leave the graph per step; ``top_k`` 0 gives the full (rows, vocab)
log-probs for the export's step-by-step parity checks. A step of constrained sentences also
asks for the log-probs of given tokens per row (their next constraint tokens, ``wanted``): the
full log-probs then come out of the graph too (to the host, on the device backend) and only
those tokens' scores are kept.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import onnxruntime as ort

from service.artefacts import (
    CROSS_ATTENTION,
    INPUT_IDS,
    LOG_PROBS,
    MEMORY_KEYS,
    MEMORY_VALUES,
    PRESENT_KEYS,
    PRESENT_VALUES,
    TOP_K,
    TOP_LOG_PROBS,
    TOP_TOKENS,
    ArtefactError,
    past_of,
)
from service.engine.session import ELEMENT_NUMPY
from service.engine.translation.candidates import Candidates
from service.engine.translation.spare_buffers import SpareBuffers

Tensor = Any  # np.ndarray on the host backend, ort.OrtValue (or its LayerView) on the device backend


# --- backends: where the memory and the cache live -----------------------------------------------


class Backend(Protocol):
    encoder: ort.InferenceSession
    decoder: ort.InferenceSession
    host_arrays: bool  # memory and cache are NumPy arrays (which joining pads and concatenates)

    def encode(self, input_ids: np.ndarray) -> tuple[Tensor, Tensor]:
        """(B, S) ids → memory keys, values (n_layers, B, heads, S, d_head)."""
        ...

    def layers(self, stacked: Tensor) -> list[Tensor]:
        """A stacked (n_layers, …) tensor's layers, as decoder feeds that copy nothing."""
        ...

    def step(
        self,
        feeds: dict[str, Tensor],
        with_attention: bool,
        wanted: np.ndarray | None = None,
        bound: StepBinding | None = None,
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None, dict[str, Tensor]]:
        """One decoder step → log-probs (N, V) (or ``Candidates`` when ``feeds`` set ``top_k``,
        with the log-probs of the ``wanted`` (N, m) tokens when given), cross-attention (N, S)
        or None, and the next step's cache feeds (``past_*`` names). ``bound``: one decode's
        binding, kept from step to step where the backend binds."""
        ...


class StepBinding:
    """One running decode's IO binding on the device backend, kept between its steps: an input is
    bound again only when its value is another object (the memory and the source mask are bound
    once a decode, the rows' sentences when they change). One per decode, never shared: a backend
    serves several decodes on several threads."""

    def __init__(self) -> None:
        self.binding: ort.IOBinding | None = None
        self.inputs: dict[str, Tensor] = {}


class HostBackend:
    """NumPy in, NumPy out: ``session.run`` copies nothing that matters on a CPU."""

    host_arrays = True

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self._presents = _present_outputs(decoder)

    def encode(self, input_ids: np.ndarray) -> tuple[Tensor, Tensor]:
        keys, values = self.encoder.run([MEMORY_KEYS, MEMORY_VALUES], {INPUT_IDS: input_ids})
        return keys, values

    def layers(self, stacked: Tensor) -> list[Tensor]:
        return list(np.asarray(stacked))  # views: a stacked array's layers are contiguous

    def step(
        self,
        feeds: dict[str, Tensor],
        with_attention: bool,
        wanted: np.ndarray | None = None,
        bound: StepBinding | None = None,
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None, dict[str, Tensor]]:
        scores = _score_outputs(feeds, wanted)
        names = [*scores, *self._presents] + ([CROSS_ATTENTION] if with_attention else [])
        out = dict(zip(names, self.decoder.run(names, feeds), strict=True))
        attn = np.asarray(out[CROSS_ATTENTION], dtype=np.float32) if with_attention else None
        return _scores(out, wanted), attn, _next_past(out)


class DeviceBackend:
    """IO binding: memory and cache stay as OrtValues on ``device``; NumPy inputs are copied in."""

    host_arrays = False

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        device: str,
        device_id: int = 0,
    ) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self._presents = _present_outputs(decoder)
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

    def layers(self, stacked: Tensor) -> list[Tensor]:
        if isinstance(stacked, np.ndarray):
            return list(stacked)
        return [LayerView(stacked, i) for i in range(stacked.shape()[0])]

    def step(
        self,
        feeds: dict[str, Tensor],
        with_attention: bool,
        wanted: np.ndarray | None = None,
        bound: StepBinding | None = None,
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None, dict[str, Tensor]]:
        scores = _score_outputs(feeds, wanted)
        on_host = [*scores, CROSS_ATTENTION] if with_attention else scores
        bound = bound or StepBinding()
        if bound.binding is None:
            bound.binding = self.decoder.io_binding()
        binding = bound.binding
        binding.clear_binding_outputs()  # a run's outputs stay bound at its shapes: unbind them
        for name in on_host:
            binding.bind_output(name, "cpu")
        for name in self._presents:
            binding.bind_output(name, self.device, self.device_id)
        for name, value in feeds.items():
            if bound.inputs.get(name) is value:
                continue
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            elif isinstance(value, LayerView):
                binding.bind_input(name, self.device, self.device_id, *value.address())
            else:
                binding.bind_ortvalue_input(name, value)
            bound.inputs[name] = value
        self.decoder.run_with_iobinding(binding)
        values = binding.get_outputs()  # in binding order
        host = {name: values[i].numpy() for i, name in enumerate(on_host)}
        attn = np.asarray(host[CROSS_ATTENTION], dtype=np.float32) if with_attention else None
        presents = dict(zip(self._presents, values[len(on_host) :], strict=True))
        return _scores(host, wanted), attn, _next_past(presents)


@dataclass(frozen=True)
class LayerView:
    """Layer ``layer`` of a stacked (n_layers, …) OrtValue on the device, bound by its address:
    what a NumPy view is on the host. It holds the stacked value, so the memory outlives it."""

    stacked: ort.OrtValue
    layer: int

    def address(self) -> tuple[type[np.generic], list[int], int]:
        """The layer's element type, shape and address, as ``IOBinding.bind_input`` takes them."""
        dtype = ELEMENT_NUMPY[self.stacked.data_type()]
        shape = self.stacked.shape()[1:]
        size = math.prod(shape) * np.dtype(dtype).itemsize
        return dtype, shape, self.stacked.data_ptr() + self.layer * size


def _score_outputs(feeds: dict[str, Tensor], wanted: np.ndarray | None) -> list[str]:
    """The decoder outputs the search reads: the candidates when ``top_k`` asks for some (and the
    full log-probs too for ``wanted`` tokens), else the full log-probs (``top_k`` 0: a
    step-by-step comparison with a reference)."""
    if TOP_K in feeds and feeds[TOP_K][0] > 0:
        return [TOP_LOG_PROBS, TOP_TOKENS] + ([LOG_PROBS] if wanted is not None else [])
    return [LOG_PROBS]


def _next_past(outputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """``present_*`` outputs renamed to the ``past_*`` inputs they feed next step."""
    return {past_of(name): x for name, x in outputs.items() if name.startswith(_PRESENTS)}


_PRESENTS = (PRESENT_KEYS, PRESENT_VALUES)


def _present_outputs(decoder: ort.InferenceSession) -> list[str]:
    return [o.name for o in decoder.get_outputs() if o.name.startswith(_PRESENTS)]


def _scores(out: dict[str, Any], wanted: np.ndarray | None) -> np.ndarray | Candidates:
    if TOP_TOKENS in out:
        log_probs = np.asarray(out[TOP_LOG_PROBS], dtype=np.float32)
        chosen = None if wanted is None else wanted_log_probs(out[LOG_PROBS], wanted)
        return Candidates(log_probs, np.asarray(out[TOP_TOKENS]), chosen)
    return np.asarray(out[LOG_PROBS], dtype=np.float32)


def wanted_log_probs(log_probs: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """(N, m) float32 log-probs of the ``wanted`` token ids from the step's (N, vocab) log-probs."""
    return np.take_along_axis(np.asarray(log_probs, dtype=np.float32), wanted, 1)


def candidate_log_probs(candidates: Candidates, wanted: np.ndarray) -> np.ndarray:
    """(N, m) float32 log-probs of the ``wanted`` token ids among each row's candidates (-inf
    for a token not among them)."""
    rows = len(candidates.tokens)
    stride = int(max(candidates.tokens.max(initial=0), wanted.max(initial=0))) + 1
    keys = (candidates.tokens + np.arange(rows)[:, None] * stride).reshape(-1)
    order = np.argsort(keys, kind="stable")
    look = (wanted + np.arange(rows)[:, None] * stride).reshape(-1)
    at = np.minimum(np.searchsorted(keys, look, sorter=order), len(keys) - 1)
    found = order[at]
    scores = np.where(keys[found] == look, candidates.log_probs.reshape(-1)[found], -np.inf)
    return scores.reshape(wanted.shape).astype(np.float32)


# --- the interface of every layout's decoder ------------------------------------------------------


class Decoder(ABC):
    """``search.IncrementalDecoder`` over one decoder layout, for one running decode: what the
    search, the running decode (``running.py``) and the export's parity checks call, and what the
    layout can do, as class attributes the engine reads once at load.

    Rows belong to sentences: ``admit`` appends sentences (their encoder memory) with a block of
    rows each, ``reorder`` keeps, repeats or drops rows between steps.
    """

    memory_per_sentence: ClassVar[bool]  # one memory for all a sentence's beams (else one per row)
    steps_over_shortlists: ClassVar[bool]  # can run decoder_shortlist.onnx (export/graphs/shortlist.py)
    cache_on_host: ClassVar[bool]  # its cache is host buffers: it never runs on a device backend
    resumes: ClassVar[bool] = False  # a new row can start on a row's kept history (``park``)

    def __init__(
        self,
        backend: Backend,
        cache_shape: tuple[int, int, int],  # (n_layers, heads, d_head)
        cache_dtype: type[np.generic],
        with_attention: bool = False,
        spare: SpareBuffers | None = None,  # the engine's, for a layout whose cache is host buffers
    ) -> None:
        self.backend = backend
        self.with_attention = with_attention  # the next steps return the cross-attention too
        self._cache_shape = cache_shape
        self._cache_dtype = cache_dtype
        self._spare = spare
        self._start()

    @abstractmethod
    def _start(self) -> None:
        """The layout's own state, for an empty decode."""

    @property
    @abstractmethod
    def joins_midway(self) -> bool:
        """Whether sentences can be admitted while others decode (``service/queue/continuous.py``)."""

    @property
    @abstractmethod
    def rows(self) -> int: ...

    @property
    @abstractmethod
    def sentences(self) -> int: ...

    @property
    @abstractmethod
    def source_len(self) -> int:
        """The width of the memory the running sentences are held in."""

    @abstractmethod
    def admit(
        self,
        memory: tuple[Tensor, Tensor],
        source_mask: np.ndarray,
        repeats: Sequence[int],
        shortlists: Sequence[np.ndarray] | None = None,
    ) -> None:
        """New sentences, from one encoder call ((n_layers, n, heads, S, d_head) K/V and their
        (n, S) mask): sentence i gets ``repeats[i]`` rows after the running ones (and, when the
        decoder steps over shortlists, the target ids ``shortlists[i]``)."""

    @abstractmethod
    def reserve(self, rows: int, sentences: int, source_len: int) -> None:
        """Room for ``rows`` rows of ``sentences`` sentences and sources of ``source_len`` tokens
        before several admissions in a row."""

    @abstractmethod
    def reorder(self, rows: np.ndarray) -> None:
        """Row i takes row ``rows[i]``'s history (int64, may repeat); rows not named leave."""

    def park(self, row: int, columns: int) -> np.ndarray:
        """A copy of ``row``'s first ``columns`` cache columns (``resumes`` decoders only)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no row's history")

    def resume(self, row: int, history: np.ndarray) -> None:
        """``row``, admitted at position 0, starts on a ``park``ed history instead."""
        raise NotImplementedError(f"{type(self).__name__} keeps no row's history")

    @abstractmethod
    def _run(
        self, last_tokens: np.ndarray, top_k: int, wanted: np.ndarray | None = None
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        """One step: each row's ``top_k`` best tokens (and the log-probs of its ``wanted`` (N, m)
        tokens when given), or the full log-probs when ``top_k`` is 0."""

    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        scores, attn = self._run(last_tokens, 0)
        assert isinstance(scores, np.ndarray)
        return scores, attn

    def step_candidates(
        self, last_tokens: np.ndarray, n: int, wanted: np.ndarray | None = None
    ) -> tuple[Candidates, np.ndarray | None]:
        scores, attn = self._run(last_tokens, n, wanted)
        assert isinstance(scores, Candidates)
        return scores, attn


def score_dtypes(decoder: ort.InferenceSession, shortlisted: bool) -> tuple[dict[str, type[np.generic]], int]:
    """The dtype of each score and attention output, and the vocabulary (``log_probs``' width;
    0 for a shortlist decoder, whose width is its shortlist's)."""
    outputs = {o.name: o for o in decoder.get_outputs()}
    vocab = 0 if shortlisted else outputs[LOG_PROBS].shape[1]
    if not isinstance(vocab, int):
        raise ArtefactError(f"the decoder's {LOG_PROBS} output has no fixed vocabulary size: {vocab!r}")
    names = (LOG_PROBS, TOP_LOG_PROBS, TOP_TOKENS, CROSS_ATTENTION)
    return {name: ELEMENT_NUMPY[outputs[name].type] for name in names}, vocab
