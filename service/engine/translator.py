"""Translation with the encoder/decoder ONNX pair: batch in, one result per item out.

Per batch: tokenize every source (pre), run the encoder once over the padded batch, then the
beam search of ``search.py`` per group of items that share search options (core), and turn the
hypotheses into text, scores, token strings and alignments (post).

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

A decoder of layout ``stacked_kv_top_k`` or ``per_layer_kv_top_k`` takes ``top_k`` and returns
each row's 2 × beam best tokens (``search.Candidates``), so only (rows, 2·beam) scores leave the
graph per step; the full (rows, vocab) log-probs are still there for the export's step-by-step
parity checks.

Iteration-level (continuous) batching would slot in at ``IncrementalDecoder``: the search
already shrinks the running batch when sentences finish (``reorder`` drops their rows); a
scheduler could instead *append* rows for newly arrived requests between steps, by running the
encoder for them and concatenating their memory K/V, source mask (padded to the longer source)
and an empty-but-aligned past (left-padded with masked positions to the current cache length,
which needs a self-attention mask input in the decoder graph). That is not built: the batcher
hands the engine whole batches, and groups per option set keep the search code unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from service.artefacts import ArtefactError, DecoderLayout, Manifest, TranslationInfo, load_and_verify
from service.engine.base import (
    Abandoned,
    TextTooLong,
    TranslateItem,
    TranslateOptions,
    Translation,
    TranslationHypothesis,
)
from service.engine.search import Candidates, Hypothesis, IncrementalDecoder, beam_search
from service.engine.session import (
    CUDA,
    NUMPY_DTYPE,
    DeviceGather,
    ProviderPref,
    check_io,
    create_session,
    device_type,
    used_provider,
)
from service.engine.tokenizer import Encoded, TextTokenizer
from service.metrics import INPUT_TOKENS, OUTPUT_TOKENS, observe_stage, timed

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
        self._presents = [o.name for o in decoder.get_outputs() if o.name.startswith("present_")]

    def encode(self, input_ids: np.ndarray) -> tuple[Tensor, Tensor]:
        keys, values = self.encoder.run(["memory_keys", "memory_values"], {"input_ids": input_ids})
        return keys, values

    def take(self, x: Tensor, rows: np.ndarray, axis: int) -> Tensor:
        return np.take(x, rows, axis=axis)

    def layer(self, x: Tensor, i: int) -> Tensor:
        return x[i]  # a view: a stacked array's layer is contiguous

    def step(
        self, feeds: dict[str, Tensor], with_attention: bool
    ) -> tuple[np.ndarray | Candidates, np.ndarray | None, dict[str, Tensor]]:
        scores = _score_outputs(feeds)
        names = [*scores, *self._presents] + (["cross_attention"] if with_attention else [])
        out = dict(zip(names, self.decoder.run(names, feeds), strict=True))
        attn = np.asarray(out["cross_attention"], dtype=np.float32) if with_attention else None
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
        self._presents = [o.name for o in decoder.get_outputs() if o.name.startswith("present_")]
        self.gather = gather
        self.device = device
        self.device_id = device_id

    def encode(self, input_ids: np.ndarray) -> tuple[Tensor, Tensor]:
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("input_ids", input_ids)
        binding.bind_output("memory_keys", self.device, self.device_id)
        binding.bind_output("memory_values", self.device, self.device_id)
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
        on_host = [*scores, "cross_attention"] if with_attention else scores
        for name in on_host:
            binding.bind_output(name, "cpu")
        for name in self._presents:
            binding.bind_output(name, self.device, self.device_id)
        self.decoder.run_with_iobinding(binding)
        values = binding.get_outputs()  # in binding order
        host = {name: values[i].numpy() for i, name in enumerate(on_host)}
        attn = np.asarray(host["cross_attention"], dtype=np.float32) if with_attention else None
        presents = dict(zip(self._presents, values[len(on_host) :], strict=True))
        return _scores(host), attn, _next_past(presents)


def _score_outputs(feeds: dict[str, Tensor]) -> list[str]:
    """The decoder outputs the search reads: the candidates when ``top_k`` asks for some, else
    the full log-probs (``top_k`` 0: a step-by-step comparison with a reference)."""
    return ["top_log_probs", "top_tokens"] if "top_k" in feeds and feeds["top_k"][0] > 0 else ["log_probs"]


def _next_past(outputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """``present_*`` outputs renamed to the ``past_*`` inputs they feed next step."""
    return {
        "past_" + name[len("present_") :]: x for name, x in outputs.items() if name.startswith("present_")
    }


def _scores(out: dict[str, Any]) -> np.ndarray | Candidates:
    if "top_tokens" in out:
        return Candidates(np.asarray(out["top_log_probs"], dtype=np.float32), np.asarray(out["top_tokens"]))
    return np.asarray(out["log_probs"], dtype=np.float32)


# --- the incremental decoder the search drives -----------------------------------------------------


class OnnxDecoder:
    """``search.IncrementalDecoder`` over ``decoder.onnx``, holding the self-attention cache.

    The cross-attention memory depends only on which *sentence* a row decodes, so it is kept
    per sentence and re-gathered only when that row → sentence map changes (start of a beam,
    sentences finishing), not on every beam reorder. ``step`` returns the full log-probs;
    ``CandidateDecoder`` drives it through ``step_candidates`` instead.
    """

    def __init__(
        self,
        backend: Backend,
        memory: tuple[Tensor, Tensor],
        source_mask: np.ndarray,
        cache_shape: tuple[int, int, int],
        cache_dtype: type[np.generic],
        with_attention: bool,
    ) -> None:
        self.backend = backend
        self.with_attention = with_attention
        self._sentence_memory = memory
        self._sentence_mask = source_mask
        self._cache_shape = cache_shape  # (n_layers, heads, d_head)
        self._cache_dtype = cache_dtype
        self._per_layer = backend.layout == "per_layer_kv_top_k"
        self._takes_top_k = backend.layout != "stacked_kv"
        self._cache_axis = 0 if self._per_layer else 1  # the rows axis of each cache feed
        n = source_mask.shape[0]
        self._row_sentence = np.arange(n)
        self._memory = self._memory_feeds(memory)
        self._mask = source_mask
        self._past = self._empty_cache(n)
        self._past_len = 0

    def _memory_feeds(self, memory: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        """The decoder's memory inputs: the stacked K/V, or each layer's (host: views)."""
        names = ("memory_keys", "memory_values")
        if not self._per_layer:
            return dict(zip(names, memory, strict=True))
        layers = self._cache_shape[0]
        return {
            f"{name}_{i}": self.backend.layer(x, i)
            for name, x in zip(names, memory, strict=True)
            for i in range(layers)
        }

    def _empty_cache(self, rows: int) -> dict[str, Tensor]:
        layers, heads, d_head = self._cache_shape
        if not self._per_layer:
            empty = np.zeros((layers, rows, heads, 0, d_head), dtype=self._cache_dtype)
            return {"past_keys": empty, "past_values": empty}
        empty = np.zeros((rows, heads, 0, d_head), dtype=self._cache_dtype)
        return {f"{name}_{i}": empty for name in ("past_keys", "past_values") for i in range(layers)}

    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        scores, attn = self._run(last_tokens, 0)
        assert isinstance(scores, np.ndarray)
        return scores, attn

    def step_candidates(self, last_tokens: np.ndarray, n: int) -> tuple[Candidates, np.ndarray | None]:
        """The step's ``n`` best tokens per row, from the graph's ``TopK`` (layout stacked_kv_top_k)."""
        scores, attn = self._run(last_tokens, n)
        assert isinstance(scores, Candidates)
        return scores, attn

    def _run(self, last_tokens: np.ndarray, top_k: int) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        feeds: dict[str, Tensor] = {
            "input_ids": np.ascontiguousarray(last_tokens, dtype=np.int64)[:, None],
            "source_mask": self._mask,
            **self._memory,
            **self._past,
        }
        if self._takes_top_k:
            feeds["top_k"] = np.array([top_k], dtype=np.int64)
        log_probs, attn, self._past = self.backend.step(feeds, self.with_attention)
        self._past_len += 1
        return log_probs, attn

    def reorder(self, rows: np.ndarray) -> None:
        if len(rows) == len(self._row_sentence) and np.array_equal(rows, np.arange(len(rows))):
            return
        if self._past_len == 0:
            self._past = self._empty_cache(len(rows))
        else:
            self._past = {
                name: self.backend.take(x, rows, self._cache_axis) for name, x in self._past.items()
            }
        sentences = self._row_sentence[rows]
        if not np.array_equal(sentences, self._row_sentence):
            keys, values = self._sentence_memory
            self._memory = self._memory_feeds(
                (self.backend.take(keys, sentences, 1), self.backend.take(values, sentences, 1))
            )
            self._mask = self._sentence_mask[sentences]
            self._row_sentence = sentences


class CandidateDecoder:
    """``search.IncrementalDecoder`` that hands the search each row's ``n`` best tokens from the
    graph (n ≥ 2 × beam keeps the search exact) instead of the (rows, vocab) log-probs."""

    def __init__(self, decoder: OnnxDecoder, n: int) -> None:
        self.decoder = decoder
        self.n = n

    def step(self, last_tokens: np.ndarray) -> tuple[Candidates, np.ndarray | None]:
        return self.decoder.step_candidates(last_tokens, self.n)

    def reorder(self, rows: np.ndarray) -> None:
        self.decoder.reorder(rows)


# --- the engine ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _GroupKey:
    beam_size: int
    n_best: int
    length_penalty: float
    alignments: bool


def _group_key(options: TranslateOptions) -> _GroupKey:
    return _GroupKey(options.beam_size, options.n_best, options.length_penalty, options.alignments)


def check_options(options: TranslateOptions) -> None:
    """Reject options the search cannot honour, for that item alone."""
    if options.beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {options.beam_size}")
    if not 1 <= options.n_best <= options.beam_size:
        raise ValueError(f"n_best must be in [1, beam_size={options.beam_size}], got {options.n_best}")
    if options.max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {options.max_length}")


class OnnxTranslator:
    """``TranslateEngine`` over a verified translation artefact directory.

    threads: onnxruntime intra-op threads (0 = one per core). io_binding: keep the cache on the
    device (default: when running on CUDA). max_decode_rows: sentences × beam per search call,
    bounding cache memory for large batches. truncate_source: cut over-long sources (keeping
    </s>) instead of failing them with ``TextTooLong``.
    """

    def __init__(
        self,
        directory: Path,
        provider_pref: ProviderPref | str = "auto",
        threads: int = 0,
        *,
        inter_op_threads: int = 1,
        allow_spinning: bool = True,
        io_binding: bool | None = None,
        max_decode_rows: int = 512,
        truncate_source: bool = False,
        device_id: int = 0,
    ) -> None:
        self.manifest: Manifest = load_and_verify(directory)
        self.info = _translation_info(self.manifest, directory)
        self.name = self.manifest.name
        special = self.manifest.special_ids
        if special.bos is None or special.eos is None:
            raise ArtefactError(f"{directory / 'manifest.json'}: translation needs bos and eos special ids")
        self.bos_id, self.eos_id = special.bos, special.eos
        self.max_decode_rows = max_decode_rows
        self.truncate_source = truncate_source
        self.tokenizer = TextTokenizer.from_file(
            directory / self.manifest.tokenizer, self.info.max_source_len, special.pad
        )
        sessions = {}
        for graph in ("encoder", "decoder"):
            if graph not in self.manifest.graphs:
                raise ArtefactError(f"{directory / 'manifest.json'}: no {graph} graph listed")
            spec = self.manifest.graphs[graph]
            path = directory / spec.file
            sessions[graph] = create_session(
                path,
                provider_pref,
                threads,
                inter_op_threads,
                allow_spinning=allow_spinning,
                device_id=device_id,
            )
            check_io(sessions[graph], spec, path)
        self.provider: str = used_provider(sessions["decoder"])
        decoder_spec = self.manifest.graphs["decoder"]
        self._cache_dtype = NUMPY_DTYPE[
            next(t.dtype for t in decoder_spec.inputs if t.name in ("past_keys", "past_keys_0"))
        ]
        has_attention_output = any(t.name == "cross_attention" for t in decoder_spec.outputs)
        self._can_align = self.info.has_alignments and has_attention_output
        layout = self.info.decoder_layout
        if layout != _layout_of({t.name for t in decoder_spec.inputs}):
            raise ArtefactError(
                f"{directory / 'manifest.json'}: decoder_layout {layout!r} does not match "
                "the decoder graph's inputs"
            )
        encoder, decoder = sessions["encoder"], sessions["decoder"]
        if io_binding if io_binding is not None else self.provider == CUDA:
            device = device_type(self.provider)
            gather = DeviceGather(provider_pref, device, device_id)
            self.backend: Backend = DeviceBackend(encoder, decoder, gather, device, device_id, layout)
        else:
            self.backend = HostBackend(encoder, decoder, layout)

    # -- Engine protocol --

    def count_tokens(self, text: str) -> int:
        return self.tokenizer.count(text)

    def warmup(self) -> None:
        """Encoder once, a few greedy and beam steps: allocations and kernels, no metrics."""
        enc = self.tokenizer.encode_batch(["warm up"], [True])[0]
        assert isinstance(enc, Encoded)
        for beam in (1, 2):
            self._search([enc.ids], _GroupKey(beam, 1, 1.0, self._can_align), max_len=3)

    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]:
        results: list[Translation | Exception | None] = [None] * len(items)
        todo = self._pre(items, results)
        if todo:
            hyps = self._core(items, todo, results)
            self._post(items, todo, hyps, results)
        return [r if r is not None else RuntimeError("item was not processed") for r in results]

    # -- pre: validate, tokenize --

    def _pre(
        self, items: Sequence[TranslateItem], results: list[Translation | Exception | None]
    ) -> dict[int, Encoded]:
        """Encodings of the items to translate; others get their result (empty) or error now."""
        todo: dict[int, Encoded] = {}
        with timed(self.name, "tokenize"):
            texts = [it.text for it in items]
            encoded = self.tokenizer.encode_batch(texts, [self.truncate_source] * len(items))
        for i, (item, enc) in enumerate(zip(items, encoded, strict=True)):
            try:
                check_options(item.options)
            except ValueError as e:
                results[i] = e
                continue
            if item.abandoned.is_set():
                results[i] = Abandoned("nobody waits for this item any more")
            elif isinstance(enc, TextTooLong):
                results[i] = enc
            elif not item.text.strip():
                results[i] = _empty_translation(item.options.alignments and self._can_align)
            else:
                todo[i] = enc
        INPUT_TOKENS.labels(model=self.name).inc(sum(e.n_tokens for e in todo.values()))
        return todo

    # -- core: encoder once, beam search per option group --

    def _core(
        self,
        items: Sequence[TranslateItem],
        todo: dict[int, Encoded],
        results: list[Translation | Exception | None],
    ) -> dict[int, list[Hypothesis]]:
        order = list(todo)
        ids, _ = self.tokenizer.pad([todo[i].ids for i in order])
        hyps: dict[int, list[Hypothesis]] = {}
        try:
            with timed(self.name, "encoder"):
                memory = self.backend.encode(ids)
        except Exception as e:
            for i in order:
                results[i] = e
            return hyps
        start = time.perf_counter()
        for key, members in self._groups(items, order):
            for chunk in _chunks(members, max(1, self.max_decode_rows // key.beam_size)):
                try:
                    hyps.update(self._search_group(items, todo, order, memory, key, chunk))
                except Exception as e:  # one failing group must not fail the others
                    for i in chunk:
                        results[i] = e
        observe_stage(self.name, "decoder", time.perf_counter() - start)
        return hyps

    def _groups(self, items: Sequence[TranslateItem], order: list[int]) -> list[tuple[_GroupKey, list[int]]]:
        groups: dict[_GroupKey, list[int]] = {}
        for i in order:
            groups.setdefault(_group_key(items[i].options), []).append(i)
        return list(groups.items())

    def _search_group(
        self,
        items: Sequence[TranslateItem],
        todo: dict[int, Encoded],
        order: list[int],
        memory: tuple[Tensor, Tensor],
        key: _GroupKey,
        members: list[int],
    ) -> dict[int, list[Hypothesis]]:
        position = {item: row for row, item in enumerate(order)}
        rows = np.array([position[i] for i in members], dtype=np.int64)
        limits = [self._limit(items[i].options) for i in members]  # each sentence stops at its own
        src_len = max(todo[i].n_tokens for i in members)
        group_memory = self._select(memory, rows, src_len)
        _, mask = self.tokenizer.pad([todo[i].ids for i in members])
        flags = [items[i].abandoned for i in members]
        found = self._decode(group_memory, mask, key, limits, lambda: [f.is_set() for f in flags])
        return dict(zip(members, found, strict=True))

    def _select(self, memory: tuple[Tensor, Tensor], rows: np.ndarray, src_len: int) -> tuple[Tensor, Tensor]:
        """The group's rows of the batch memory, cut to the group's longest source."""
        out = []
        for x in memory:
            n_rows, full_len = _shape(x)[1], _shape(x)[3]
            if len(rows) != n_rows or not np.array_equal(rows, np.arange(n_rows)):
                x = self.backend.take(x, rows, 1)
            if src_len < full_len:
                x = self.backend.take(x, np.arange(src_len), 3)
            out.append(x)
        return out[0], out[1]

    def _decode(
        self,
        memory: tuple[Tensor, Tensor],
        mask: np.ndarray,
        key: _GroupKey,
        max_len: int | Sequence[int],
        abandoned: Callable[[], Sequence[bool]] | None = None,
    ) -> list[list[Hypothesis]]:
        decoder = OnnxDecoder(
            self.backend,
            memory,
            mask,
            (self.info.n_layers, self.info.n_heads, self.info.d_head),
            self._cache_dtype,
            with_attention=key.alignments and self._can_align,
        )
        search_decoder: IncrementalDecoder = decoder
        if self.info.decoder_layout != "stacked_kv":
            search_decoder = CandidateDecoder(decoder, min(2 * key.beam_size, self.manifest.vocab_size))
        return beam_search(
            search_decoder,
            mask.shape[0],
            beam_size=key.beam_size,
            max_len=max_len,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            n_best=key.n_best,
            length_penalty=key.length_penalty,
            abandoned=abandoned,
        )

    def _search(self, src_ids: list[list[int]], key: _GroupKey, max_len: int) -> list[list[Hypothesis]]:
        """Encoder + search for raw ids, without metrics (warmup, tests)."""
        ids, mask = self.tokenizer.pad(src_ids)
        return self._decode(self.backend.encode(ids), mask, key, max_len)

    def _limit(self, options: TranslateOptions) -> int:
        return min(options.max_length, self.info.max_target_len)

    # -- post: detokenize, n-best, alignments --

    def _post(
        self,
        items: Sequence[TranslateItem],
        todo: dict[int, Encoded],
        hyps: dict[int, list[Hypothesis]],
        results: list[Translation | Exception | None],
    ) -> None:
        n_out = 0
        with timed(self.name, "detokenize"):
            for i, found in hyps.items():
                if items[i].abandoned.is_set():  # it may have left the search half-way
                    results[i] = Abandoned("nobody waits for this item any more")
                    continue
                results[i] = self._translation(items[i].options, todo[i], found)
                n_out += len(found[0].tokens[: self._limit(items[i].options)]) if found else 0
        OUTPUT_TOKENS.labels(model=self.name).inc(n_out)

    def _translation(
        self, options: TranslateOptions, source: Encoded, found: list[Hypothesis]
    ) -> Translation:
        """n-best texts, scores, pieces and alignments; cut to max_length (a no-op safeguard:
        the search already stops each sentence at its own limit)."""
        limit = self._limit(options)
        want_alignment = options.alignments and self._can_align
        cut = [h.tokens[:limit] for h in found]
        texts = self.tokenizer.decode_batch(cut)
        hypotheses = [
            TranslationHypothesis(
                text=text,
                score=float(h.score),
                tokens=self.tokenizer.id_to_tokens(tokens),
                alignment=_alignment(h, len(tokens), source.n_tokens) if want_alignment else None,
            )
            for h, tokens, text in zip(found, cut, texts, strict=True)
        ]
        return Translation(
            hypotheses=hypotheses,
            source_tokens=source.tokens,
            n_input_tokens=source.n_tokens,
            n_output_tokens=len(cut[0]) if cut else 0,
        )


# --- helpers ------------------------------------------------------------------------------------


def _translation_info(manifest: Manifest, directory: Path) -> TranslationInfo:
    if manifest.task != "translate" or manifest.translation is None:
        raise ArtefactError(f"{directory / 'manifest.json'}: task {manifest.task!r} is not a translation")
    return manifest.translation


def _layout_of(decoder_inputs: set[str]) -> DecoderLayout:
    if "past_keys_0" in decoder_inputs:
        return "per_layer_kv_top_k"
    return "stacked_kv_top_k" if "top_k" in decoder_inputs else "stacked_kv"


def _shape(x: Tensor) -> list[int]:
    return list(x.shape) if isinstance(x, np.ndarray) else list(x.shape())


def _chunks(xs: list[int], size: int) -> list[list[int]]:
    return [xs[i : i + size] for i in range(0, len(xs), size)]


def _alignment(h: Hypothesis, n_target: int, n_source: int) -> list[list[float]]:
    """(target tokens, source tokens) cross-attention; the padded source columns dropped."""
    if h.alignment is None:
        return []
    return [[float(x) for x in row[:n_source]] for row in h.alignment[:n_target]]


def _empty_translation(with_alignment: bool) -> Translation:
    """An empty source translates to one empty hypothesis, without running the model."""
    alignment: list[list[float]] | None = [] if with_alignment else None
    hypothesis = TranslationHypothesis(text="", score=0.0, tokens=[], alignment=alignment)
    return Translation(hypotheses=[hypothesis], source_tokens=[], n_input_tokens=0, n_output_tokens=0)
