"""Translation systems under test: the same weights in Hugging Face generate, CTranslate2 and
our engine/service, each taking text and giving text.

HF and CTranslate2 are fed ids from the same ``tokenizers`` tokenizer our engine uses (encode +
decode are inside the timed region for all). Decoding is either natural (stops at ``</s>``; the
same max length for all) or forced to a fixed length (``</s>`` suppressed: HF/CT2 ``min = max
length``, ours a wrapped decoder backend that masks ``</s>``), so every system does the same work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from service.engine.session import SessionConfig

BASELINE = "HF transformers"
CT2_INT8 = "CTranslate2 int8"
CT2_INT8_REPLICAS = "CTranslate2 int8 (replicas)"
# CTranslate2's two ways to use N threads; "× CT2 int8" compares with the faster in each table
CT2_INT8_CONFIGS = (CT2_INT8, CT2_INT8_REPLICAS)


@dataclass(frozen=True)
class Workload:
    beam: int
    batch: int
    max_len: int  # natural: upper bound; forced: exact output length
    forced: bool


class Translator(Protocol):
    name: str
    server_pids: Sequence[int]  # the server process(es) doing the work, when over HTTP; () in-process

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        """Translations and the number of generated target tokens."""
        ...


class TextCodec:
    """Our ``tokenizers`` tokenizer as the shared front/back end of HF and CTranslate2."""

    def __init__(self, tokenizer: Any, eos_id: int, pad_id: int) -> None:
        """tokenizer: a ``tokenizers.Tokenizer`` or the path of its JSON file."""
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer)) if isinstance(tokenizer, str | Path) else tokenizer
        self.eos_id, self.pad_id = eos_id, pad_id

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        ids = [e.ids for e in self.tok.encode_batch(list(texts))]
        return [x if x and x[-1] == self.eos_id else [*x, self.eos_id] for x in ids]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.tok.decode_batch([list(x) for x in ids])

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.tok.id_to_token(i) for i in ids]  # type: ignore[misc]


class HFGenerate:
    """``generate`` of a Marian or M2M-100/NLLB model; ``forced_first``: the target language's
    token forced first (transformers' ``forced_bos_token_id``), for a multilingual model."""

    name = BASELINE
    server_pids: Sequence[int] = ()

    def __init__(
        self, model_dir: Path, codec: TextCodec, threads: int, forced_first: int | None = None
    ) -> None:
        import torch
        import transformers
        from transformers import AutoModelForSeq2SeqLM

        transformers.logging.set_verbosity_error()  # one max_length warning per generate call otherwise
        transformers.logging.disable_progress_bar()
        torch.set_num_threads(threads)
        self.model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
        self.codec = codec
        self.start = int(self.model.config.decoder_start_token_id)
        self.forced_first = forced_first

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        return hf_generate(self.model, self.codec, self.start, texts, w, forced_first=self.forced_first)


def hf_generate(
    model: Any,
    codec: TextCodec,
    start: int,
    texts: Sequence[str],
    w: Workload,
    device: str = "cpu",
    forced_first: int | None = None,
) -> tuple[list[str], int]:
    """``model.generate`` with beam search as every system of the table runs it (length penalty
    1, early stopping, one hypothesis): the texts and their output token count (a forced first
    token is one of them, and of ``w.max_len``, as ``max_new_tokens`` counts it)."""
    import torch

    ids = codec.encode(texts)
    width = max(map(len, ids))
    src = torch.tensor([x + [codec.pad_id] * (width - len(x)) for x in ids], device=device)
    # Forced: exactly max_len tokens; Marian's forced </s> at the last step would make it max_len - 1.
    kwargs: dict[str, Any] = {"min_new_tokens": w.max_len, "forced_eos_token_id": None} if w.forced else {}
    if forced_first is not None:
        kwargs["forced_bos_token_id"] = forced_first
    with torch.inference_mode():
        out = model.generate(
            input_ids=src,
            attention_mask=(src != codec.pad_id).long(),
            num_beams=w.beam,
            do_sample=False,
            max_new_tokens=w.max_len,
            early_stopping=True,
            length_penalty=1.0,
            num_return_sequences=1,
            **kwargs,
        )
    hyps = []
    for row in out.tolist():  # on a GPU the copy to the host waits for it: the timing is complete
        row = row[1:] if row and row[0] == start else row
        cut = row.index(codec.eos_id) if codec.eos_id in row else len(row)
        hyps.append([t for t in row[:cut] if t != codec.pad_id])
    return codec.decode(hyps), sum(map(len, hyps))


class CTranslate2:
    """One translator with ``threads`` intra-op threads, or with ``replicas``: ``threads``
    single-threaded replicas (``inter_threads``), each batch split among them
    (``max_batch_size`` = ⌈batch / threads⌉), CTranslate2's data-parallel mode. ``target_prefix``:
    a multilingual model's target-language token, which CTranslate2 forces first (its
    hypotheses and ``max_decoding_length`` include it)."""

    server_pids: Sequence[int] = ()

    def __init__(
        self,
        model_dir: Path,
        codec: TextCodec,
        threads: int,
        name: str,
        replicas: bool = False,
        use_vmap: bool = False,
        target_prefix: str | None = None,
    ) -> None:
        import ctranslate2

        self.name = name
        self.target_prefix = target_prefix
        self.use_vmap = use_vmap  # the vocabulary map converted into the model
        self.replicas = threads if replicas else 1
        self.tr = ctranslate2.Translator(
            str(model_dir),
            device="cpu",
            intra_threads=1 if replicas else threads,
            inter_threads=self.replicas,
        )
        self.codec = codec

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        codec = self.codec
        tokens = [codec.tokens(x) for x in codec.encode(texts)]
        res = self.tr.translate_batch(
            tokens,
            beam_size=w.beam,
            max_batch_size=-(-len(tokens) // self.replicas) if self.replicas > 1 else 0,
            max_decoding_length=w.max_len,
            min_decoding_length=w.max_len if w.forced else 0,
            length_penalty=1.0,
            return_scores=False,
            use_vmap=self.use_vmap,
            target_prefix=None if self.target_prefix is None else [[self.target_prefix]] * len(tokens),
        )
        hyps = [[codec.tok.token_to_id(t) for t in r.hypotheses[0]] for r in res]
        return codec.decode(hyps), sum(map(len, hyps))  # type: ignore[arg-type]


class OursInProcess:
    """Our ``OnnxTranslator`` called directly (no queue, no HTTP), on ``threads`` lanes of one
    intra-op thread each: a batch's sentences, in length order, dealt out to ``threads``
    ``translate`` calls side by side (``embedding.Lanes``; onnxruntime releases the GIL while it
    runs), so that every lane gets short and long sentences alike and each is one running decode.
    On N cores, N such lanes keep every core busy, where one decode's intra-op threads split
    kernels too small to gain from it (docs/decisions.md, "Worker threads"). The service gets the
    same from its worker threads, behind its queue, which this system leaves out."""

    server_pids: Sequence[int] = ()

    def __init__(self, artefact_dir: Path, threads: int, name: str, shortlist: bool = False) -> None:
        from benchmarks.embedding import Lanes
        from service.engine.translation.translator import OnnxTranslator

        if threads < 1:
            raise ValueError(f"lanes must be >= 1, got {threads}")
        self.name = name
        self.engine: Any = OnnxTranslator(artefact_dir, SessionConfig("cpu", 1), shortlist=shortlist)
        self.lanes = Lanes(threads, threads)
        self.engine.warmup()
        self._eos_id = self.engine.eos_id

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        from service.engine.base import TranslateItem, TranslateOptions, Translation

        # Forced: no token ends a sentence (</s> is then an ordinary token), so every output has
        # max_len tokens, as CTranslate2's min_decoding_length and HF's min_new_tokens give.
        self.engine.eos_id = -1 if w.forced else self._eos_id
        opts = TranslateOptions(beam_size=w.beam, max_length=w.max_len)
        out = self.dealt_out([TranslateItem(t, opts) for t in texts])
        errors = [r for r in out if not isinstance(r, Translation)]
        if errors:
            raise errors[0]
        translations = [r for r in out if isinstance(r, Translation)]
        # A multilingual model's forced target-language token: one of max_len's tokens, left out
        # of n_output_tokens; counted here as transformers and CTranslate2 count it.
        forced = int(self.engine.default_forced_first is not None)
        return [r.hypotheses[0].text for r in translations], sum(
            r.n_output_tokens + forced for r in translations
        )

    def dealt_out(self, items: Sequence[Any]) -> list[Any]:
        """Each ``TranslateItem``'s result, in order: the items tokenized once, then dealt out to
        the lanes in turn, in length order (one item: no hand-off to another thread)."""
        encoded = self.engine.encode([item.text for item in items])
        items = [replace(item, encoded=enc) for item, enc in zip(items, encoded, strict=True)]
        order = sorted(range(len(items)), key=lambda i: encoded[i].n_tokens)
        shares = [order[k :: self.lanes.n] for k in range(min(self.lanes.n, len(order)))]
        results: list[Any] = [None] * len(items)

        def lane(share: list[int]) -> None:
            for i, result in zip(share, self.engine.translate([items[i] for i in share]), strict=True):
                results[i] = result

        if shares:
            self.lanes.run(lane, shares)
        return results


class OursHTTP:
    """Our service over HTTP: one POST /v1/translate per batch (natural decoding only)."""

    def __init__(self, base_url: str, server_pid: int, name: str = "ours HTTP (int8)") -> None:
        import httpx

        self.name = name
        self.server_pids: Sequence[int] = (server_pid,)
        self.client = httpx.Client(base_url=base_url, timeout=600)

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        if w.forced:
            raise NotImplementedError("the service has no option to suppress </s>")
        body = {"text": list(texts), "beam_size": w.beam, "max_length": w.max_len, "length_penalty": 1.0}
        r = self.client.post("/v1/translate", json=body)  # the penalty every system here decodes with
        r.raise_for_status()
        return parse_translate_response(r.json())


def parse_translate_response(body: dict[str, Any]) -> tuple[list[str], int]:
    """Texts and output-token count from our /v1/translate answer."""
    texts = [(t.get("hypotheses") or [{}])[0].get("text", "") for t in body.get("translations", [])]
    return texts, int(body.get("usage", {}).get("output_tokens", 0))
