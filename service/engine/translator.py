"""Translation with the encoder/decoder ONNX pair: batch in, one result per item out.

Per batch: tokenize every source (pre), run the encoder once over the padded batch, then the
beam search of ``search.py`` per group of items that share search options (core), and turn the
hypotheses into text, scores, token strings and alignments (post).

The decoder's key/value cache lives in a backend (``decoding.py``: ``HostBackend`` on CPU,
``DeviceBackend`` with IO binding on CUDA).

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

import numpy as np

from service.artefacts import ArtefactError, DecoderLayout, Manifest, TranslationInfo, load_and_verify
from service.engine.base import (
    Abandoned,
    TextTooLong,
    TranslateItem,
    TranslateOptions,
    Translation,
    TranslationHypothesis,
)
from service.engine.decoding import (
    Backend,
    CandidateDecoder,
    DeviceBackend,
    HostBackend,
    OnnxDecoder,
    Tensor,
)
from service.engine.search import Hypothesis, IncrementalDecoder, beam_search
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
