"""Translation with the encoder/decoder ONNX pair: batch in, one result per item out.

Per batch: tokenize every source (pre), then one running decode (``running.py``): sentences are
encoded as they join, every decoder step serves all running sentences whatever their search
options, and each leaves as soon as it is done (core); the hypotheses become text, scores, token
strings and alignments (post). The same running decode serves the continuous executor
(``service/queue/continuous.py``), which admits sentences from new requests between steps.

The decoder's key/value cache lives in a backend (``decoding.py``: ``HostBackend`` on CPU,
``DeviceBackend`` with IO binding on CUDA), and the decoder class of the artefact's layout is
chosen once here, at load (``layouts.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from service.artefacts import (
    CACHE_DTYPE_INPUTS,
    CROSS_ATTENTION,
    ArtefactError,
    Manifest,
    TranslationInfo,
    load_and_verify,
)
from service.cuda import CUDA
from service.engine.base import (
    Abandoned,
    TextTooLong,
    TranslateItem,
    TranslateOptions,
    Translation,
)
from service.engine.session import (
    DEFAULT_SESSION,
    NUMPY_DTYPE,
    SessionConfig,
    check_io,
    create_session,
    device_type,
    used_provider,
)
from service.engine.tokenizer import Encoded, TextTokenizer
from service.engine.translation.beam_step import WIDEST_BEAM
from service.engine.translation.constraints import PhraseSpeller
from service.engine.translation.decoding import Backend, Decoder, DeviceBackend, HostBackend
from service.engine.translation.layouts import decoder_class
from service.engine.translation.results import empty_translation, to_translation
from service.engine.translation.running import DecodeShape, RunningDecode, output_limit, sentence_constraints
from service.engine.translation.sentence_search import TokenHypothesis
from service.engine.translation.shortlist import VocabularyMap
from service.engine.translation.spare_buffers import SpareBuffers
from service.metrics import INPUT_TOKENS, OUTPUT_TOKENS, labelled, observe_stage, timed

# --- the engine ---------------------------------------------------------------------------------


def check_options(options: TranslateOptions) -> None:
    """Reject options the search cannot honour, for that item alone."""
    if not 1 <= options.beam_size <= WIDEST_BEAM:
        raise ValueError(f"beam_size must be in [1, {WIDEST_BEAM}], got {options.beam_size}")
    if not 1 <= options.n_best <= options.beam_size:
        raise ValueError(f"n_best must be in [1, beam_size={options.beam_size}], got {options.n_best}")
    if options.max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {options.max_length}")


class OnnxTranslator:
    """``TranslateEngine`` over a verified translation artefact directory.

    session: how its onnxruntime sessions run. io_binding: keep the cache on the
    device (default: when running on CUDA). max_decode_rows: sentences × beam per running decode,
    bounding cache memory for large batches. truncate_source: cut over-long sources (keeping
    </s>) instead of failing them with ``TextTooLong``. shortlist: decode each sentence over its
    vocabulary shortlist (service/engine/translation/shortlist.py; the artefact must carry a vocabulary map).
    One ``translate`` call is one running decode; the service runs several side by side on its
    worker threads (``service/queue/``).
    """

    def __init__(
        self,
        directory: Path,
        session: SessionConfig = DEFAULT_SESSION,
        *,
        io_binding: bool | None = None,
        max_decode_rows: int = 512,
        truncate_source: bool = False,
        shortlist: bool = False,
    ) -> None:
        self.manifest: Manifest = load_and_verify(directory)
        self.info = _translation_info(self.manifest, directory)
        self.name = self.manifest.name
        special = self.manifest.special_ids
        if special.bos is None or special.eos is None:
            raise ArtefactError(f"{directory / 'manifest.json'}: translation needs bos and eos special ids")
        self.bos_id, self.eos_id = special.bos, special.eos
        # A multilingual artefact forces its first target language's token where the options
        # name none (the export lists the pair it verified first), and its input carries a
        # source-language token the options may replace (``_from_source_language``).
        tokens = self.info.language_tokens
        first_target = self.info.target_languages[0] if self.info.target_languages else ""
        self.default_forced_first = tokens.get(first_target)
        self._language_ids = frozenset(tokens.values())
        self.max_decode_rows = max_decode_rows
        self.truncate_source = truncate_source
        self.decoder_class = decoder_class(self.manifest, self.info, directory)
        self._spare = SpareBuffers()  # the last decode's cache buffers, for the next one
        self.tokenizer = TextTokenizer.from_file(
            directory / self.manifest.tokenizer, self.info.max_source_len, special.pad
        )
        # The target side of the joint vocabulary, for the phrases a sentence's output must hold
        self.speller = PhraseSpeller(Tokenizer.from_file(str(directory / self.manifest.tokenizer)))
        sessions: dict[str, ort.InferenceSession] = {}
        self.vocabulary_map: VocabularyMap | None = None
        if shortlist:  # its decoder then steps over shortlists only: the plain one is not loaded
            self.vocabulary_map = self._vocabulary_map(directory)
        for graph in ("encoder", "decoder"):
            if graph not in self.manifest.graphs:
                raise ArtefactError(f"{directory / 'manifest.json'}: no {graph} graph listed")
            spec = self.manifest.graphs["decoder_shortlist" if shortlist and graph == "decoder" else graph]
            path = directory / spec.file
            sessions[graph] = create_session(path, session)
            check_io(sessions[graph], spec, path)
        self.provider: str = used_provider(sessions["decoder"])
        decoder_spec = self.manifest.graphs["decoder"]
        self.cache_dtype = NUMPY_DTYPE[
            next(t.dtype for t in decoder_spec.inputs if t.name in CACHE_DTYPE_INPUTS)
        ]
        has_attention_output = any(t.name == CROSS_ATTENTION for t in decoder_spec.outputs)
        self._can_align = self.info.has_alignments and has_attention_output
        encoder, decoder = sessions["encoder"], sessions["decoder"]
        on_device = io_binding if io_binding is not None else self.provider == CUDA
        if on_device and not self.decoder_class.cache_on_host:
            device = device_type(self.provider)
            self.backend: Backend = DeviceBackend(encoder, decoder, device, session.device_id)
        else:
            self.backend = HostBackend(encoder, decoder)

    def _vocabulary_map(self, directory: Path) -> VocabularyMap:
        """The vocabulary map of an artefact exported with ``--vmap`` (which then lists the
        ``decoder_shortlist`` graph)."""
        where = directory / "manifest.json"
        if self.manifest.variant == "fp16":
            raise ArtefactError(f"{where}: the fp16 variant has no shortlist (fp32 and int8 have)")
        if self.info.vocabulary_map is None or "decoder_shortlist" not in self.manifest.graphs:
            raise ArtefactError(f"{where}: no vocabulary map to shortlist with (export with --vmap FILE)")
        if not self.decoder_class.steps_over_shortlists:
            raise ArtefactError(f"{where}: the {self.info.decoder_layout} decoder has no shortlist")
        special = self.manifest.special_ids
        always = [i for i in (special.bos, special.eos, special.unk) if i is not None]
        return VocabularyMap.read(directory / self.info.vocabulary_map, self.tokenizer.token_to_id, always)

    @property
    def joins_midway(self) -> bool:
        """Whether sentences can join a running decode (``service/queue/continuous.py``)."""
        return self.new_decoder().joins_midway

    # -- Engine protocol --

    def count_tokens(self, text: str) -> int:
        return self.tokenizer.count(text)

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        return self.tokenizer.encode(texts)

    def warmup(self) -> None:
        """Encoder once, a few greedy and beam steps: allocations and kernels, no metrics."""
        enc = self.tokenizer.encode_batch(["warm up"], [True])[0]
        assert isinstance(enc, Encoded)
        for beam in (1, 2):
            self._search([enc.ids], TranslateOptions(beam_size=beam, max_length=3, alignments=True))

    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]:
        results: list[Translation | Exception | None] = [None] * len(items)
        todo = self.prepare(items, results)
        if todo:
            hyps = self._decode(items, list(todo), todo, results)
            self.finish(items, todo, hyps, results)
        return [r if r is not None else RuntimeError("item was not processed") for r in results]

    # -- pre: validate, tokenize --

    def prepare(
        self, items: Sequence[TranslateItem], results: list[Translation | Exception | None]
    ) -> dict[int, Encoded]:
        """Encodings of the items to translate; others get their result (empty) or error now."""
        todo: dict[int, Encoded] = {}
        with timed(self.name, "tokenize"):
            texts = [it.text for it in items]
            encoded = self.tokenizer.encode_batch(
                texts, [self.truncate_source] * len(items), [it.encoded for it in items]
            )
        for i, (item, enc) in enumerate(zip(items, encoded, strict=True)):
            try:
                check_options(item.options)
                self._constraints_fit(item.options)  # ConstraintUnsatisfiable is a ValueError
            except ValueError as e:
                results[i] = e
                continue
            if item.abandoned.is_set():
                results[i] = Abandoned("nobody waits for this item any more")
            elif isinstance(enc, TextTooLong):
                results[i] = enc
            elif not item.text.strip():
                results[i] = empty_translation(item.options.alignments and self._can_align)
            else:
                try:
                    todo[i] = self._from_source_language(enc, item.options.source_token)
                except ValueError as e:
                    results[i] = e
        labelled(INPUT_TOKENS, self.name).inc(sum(e.n_tokens for e in todo.values()))
        return todo

    def _constraints_fit(self, options: TranslateOptions) -> None:
        """Raise ``ConstraintUnsatisfiable`` for required phrases the search could not meet."""
        forced = (
            self.default_forced_first if options.forced_first_token is None else options.forced_first_token
        )
        limit = output_limit(options, self.info.max_target_len)
        sentence_constraints(self.speller, options, limit, forced)

    def _from_source_language(self, enc: Encoded, token: int | None) -> Encoded:
        """``enc`` with ``token`` in place of its source-language token (a multilingual model's
        tokenizer puts its default source language's first, or last after ``</s>`` in NLLB's
        legacy layout); as it is for None."""
        if token is None:
            return enc
        ends = (0, len(enc.ids) - 1) if enc.ids else ()
        at = next((i for i in ends if enc.ids[i] in self._language_ids), None)
        if at is None or token not in self._language_ids:
            raise ValueError(f"{self.name} has no source-language token to set to {token}")
        ids, tokens = list(enc.ids), list(enc.tokens)
        ids[at] = token
        if tokens:
            tokens[at] = self.tokenizer.id_to_tokens([token])[0]
        return Encoded(ids, tokens, enc.truncated, enc.offsets)

    # -- core: a running decode that sentences join and leave --

    def new_decoder(self, with_attention: bool = False) -> Decoder:
        """An empty decoder of the artefact's layout on this engine's backend."""
        cache_shape = (self.info.n_layers, self.info.n_heads, self.info.d_head)
        return self.decoder_class(self.backend, cache_shape, self.cache_dtype, with_attention, self._spare)

    def release_spare_memory(self) -> int:
        """Let go of the cache buffers kept for the next decode (the service does, once idle);
        → the bytes they held."""
        return self._spare.release()

    def new_decode(self) -> RunningDecode:
        """An empty running decode on this engine (``translate`` and the scheduler drive one)."""
        info = self.info
        shape = DecodeShape(
            info.n_layers,
            info.n_heads,
            info.d_head,
            np.dtype(self.cache_dtype).itemsize,
            self.manifest.vocab_size,
            info.max_target_len,
            self.decoder_class.memory_per_sentence,
        )
        return RunningDecode(
            self.backend,
            self.new_decoder(),
            shape,
            self.tokenizer,
            (self.bos_id, self.eos_id),
            self._can_align,
            self.vocabulary_map,
            self.default_forced_first,
            self.info.early_stopping,
            self.speller,
            self.name,
        )

    def _decode(
        self,
        items: Sequence[TranslateItem],
        waiting: list[int],
        todo: dict[int, Encoded],
        results: list[Translation | Exception | None],
    ) -> dict[int, list[TokenHypothesis]]:
        """The ``waiting`` items' sentences through one running decode: sentences join as rows
        free up (at most ``max_decode_rows``: sentences × beam), leave when done or abandoned; a
        step that fails fails the sentences in it, not those still waiting."""
        decode = self.new_decode()
        hyps: dict[int, list[TokenHypothesis]] = {}
        decoding = 0.0
        while waiting or decode.running:
            if waiting and decode.can_admit():
                batch = self._admissible(items, waiting, decode.rows)
                try:
                    with timed(self.name, "encoder"):
                        done = decode.admit([(i, todo[i], items[i].options) for i in batch])
                    hyps.update((s.key, s.results()) for s in done)
                except Exception as e:
                    for i in batch:
                        results[i] = e
            for s in decode.remove(lambda s: items[s.key].abandoned.is_set()):
                results[s.key] = Abandoned("nobody waits for this item any more")
            if not decode.running:
                continue
            start = time.perf_counter()
            try:
                finished = decode.step()
            except Exception as e:  # the sentences of this step fail; those waiting go on
                for s in decode.sentences:
                    results[s.key] = e
                decode = self.new_decode()
                finished = []
            decoding += time.perf_counter() - start
            hyps.update((s.key, s.results()) for s in finished)
        observe_stage(self.name, "decoder", decoding)
        return hyps

    def _admissible(self, items: Sequence[TranslateItem], waiting: list[int], rows: int) -> list[int]:
        """The next waiting items whose rows fit beside ``rows`` running ones (at least one)."""
        batch: list[int] = []
        while waiting:
            k = items[waiting[0]].options.beam_size
            if (batch or rows) and rows + k > self.max_decode_rows:
                break
            batch.append(waiting.pop(0))
            rows += k
        return batch

    def _search(self, src_ids: list[list[int]], key: TranslateOptions) -> list[list[TokenHypothesis]]:
        """Encoder + search for raw ids, without metrics (warmup)."""
        decode = self.new_decode()
        found: dict[int, list[TokenHypothesis]] = {}
        sources = [Encoded(ids, [], False) for ids in src_ids]
        for s in decode.admit([(i, src, key) for i, src in enumerate(sources)]):
            found[s.key] = s.results()
        while decode.running:
            found.update((s.key, s.results()) for s in decode.step())
        return [found[i] for i in range(len(src_ids))]

    # -- post: detokenize, n-best, alignments --

    def finish(
        self,
        items: Sequence[TranslateItem],
        todo: dict[int, Encoded],
        hyps: dict[int, list[TokenHypothesis]],
        results: list[Translation | Exception | None],
    ) -> None:
        n_out = 0
        with timed(self.name, "detokenize"):
            for i, found in hyps.items():
                if items[i].abandoned.is_set():  # it may have left the search half-way
                    results[i] = Abandoned("nobody waits for this item any more")
                    continue
                options = items[i].options
                results[i] = to_translation(
                    self.tokenizer,
                    todo[i],
                    found,
                    output_limit(options, self.info.max_target_len),
                    options.alignments and self._can_align,
                )
                n_out += (
                    len(found[0].tokens[: output_limit(items[i].options, self.info.max_target_len)])
                    if found
                    else 0
                )
        labelled(OUTPUT_TOKENS, self.name).inc(n_out)


# --- helpers ------------------------------------------------------------------------------------


def _translation_info(manifest: Manifest, directory: Path) -> TranslationInfo:
    if manifest.task != "translate" or manifest.translation is None:
        raise ArtefactError(f"{directory / 'manifest.json'}: task {manifest.task!r} is not a translation")
    return manifest.translation
