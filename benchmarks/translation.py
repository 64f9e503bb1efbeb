"""Translation: the same weights in Hugging Face generate, CTranslate2 and our engine/service.

Every system gets text in and gives text out: HF and CTranslate2 are fed ids from the same
``tokenizers`` tokenizer our engine uses (encode + decode are inside the timed region for all).
Batches are formed once, from length-sorted sentences, and every system decodes the same
batches in the same order. Throughput is target tokens/s (generated tokens, without the start
token and ``</s>``). Decoding is either natural (stops at ``</s>``; the same max length for all)
or forced to a fixed length (``</s>`` suppressed: HF/CT2 ``min = max length``, ours a wrapped
decoder backend that masks ``</s>``), so every system does the same work.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from benchmarks.common import Results, Row, percentiles_ms
from service.engine.search import Candidates

BASELINE = "HF transformers"
CT2_INT8 = "CTranslate2 int8"


@dataclass(frozen=True)
class Workload:
    beam: int
    batch: int
    max_len: int  # natural: upper bound; forced: exact output length
    forced: bool


class Translator(Protocol):
    name: str

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
    name = BASELINE

    def __init__(self, model_dir: Path, codec: TextCodec, threads: int) -> None:
        import torch
        import transformers
        from transformers import MarianMTModel

        transformers.logging.set_verbosity_error()  # one max_length warning per generate call otherwise
        transformers.logging.disable_progress_bar()
        torch.set_num_threads(threads)
        self.torch = torch
        self.model = MarianMTModel.from_pretrained(model_dir).eval()
        self.codec = codec
        self.start = int(self.model.config.decoder_start_token_id)

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        torch, codec = self.torch, self.codec
        ids = codec.encode(texts)
        width = max(map(len, ids))
        src = torch.tensor([x + [codec.pad_id] * (width - len(x)) for x in ids])
        # Forced: exactly max_len tokens; Marian's forced </s> at the last step would make it max_len - 1.
        kwargs: dict[str, Any] = (
            {"min_new_tokens": w.max_len, "forced_eos_token_id": None} if w.forced else {}
        )
        with torch.inference_mode():
            out = self.model.generate(
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
        for row in out.tolist():
            row = row[1:] if row and row[0] == self.start else row
            cut = row.index(codec.eos_id) if codec.eos_id in row else len(row)
            hyps.append([t for t in row[:cut] if t != codec.pad_id])
        return codec.decode(hyps), sum(map(len, hyps))


class CTranslate2:
    def __init__(self, model_dir: Path, codec: TextCodec, threads: int, name: str) -> None:
        import ctranslate2

        self.name = name
        self.tr = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=threads, inter_threads=1)
        self.codec = codec

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        codec = self.codec
        tokens = [codec.tokens(x) for x in codec.encode(texts)]
        res = self.tr.translate_batch(
            tokens,
            beam_size=w.beam,
            max_batch_size=0,
            max_decoding_length=w.max_len,
            min_decoding_length=w.max_len if w.forced else 0,
            length_penalty=1.0,
            return_scores=False,
        )
        hyps = [[codec.tok.token_to_id(t) for t in r.hypotheses[0]] for r in res]
        return codec.decode(hyps), sum(map(len, hyps))  # type: ignore[arg-type]


class _EosMask:
    """Wraps the engine's decoder backend: ``</s>`` never wins, so every output has max_len tokens."""

    def __init__(self, inner: Any, eos_id: int) -> None:
        self.inner, self.eos_id = inner, eos_id
        self.layout = inner.layout

    def encode(self, input_ids: np.ndarray) -> Any:
        return self.inner.encode(input_ids)

    def take(self, x: Any, rows: np.ndarray, axis: int) -> Any:
        return self.inner.take(x, rows, axis)

    def layer(self, x: Any, i: int) -> Any:
        return self.inner.layer(x, i)

    def step(self, feeds: dict[str, Any], with_attention: bool) -> Any:
        scores, attn, past = self.inner.step(feeds, with_attention)
        if isinstance(scores, Candidates):  # a TopK decoder layout: drop </s> from the candidates
            return (
                Candidates(np.where(scores.tokens == self.eos_id, -np.inf, scores.log_probs), scores.tokens),
                attn,
                past,
            )
        log_probs = np.array(scores, copy=True)
        log_probs[:, self.eos_id] = -np.inf
        return log_probs, attn, past


class OursInProcess:
    """Our ``OnnxTranslator`` called directly (no batcher, no HTTP)."""

    def __init__(self, artefact_dir: Path, threads: int, name: str) -> None:
        from service.engine.translator import OnnxTranslator

        self.name = name
        self.engine: Any = OnnxTranslator(artefact_dir, "cpu", threads)
        self.engine.warmup()
        self._plain = self.engine.backend
        self._masked = _EosMask(self._plain, self.engine.eos_id)

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        from service.engine.base import TranslateItem, TranslateOptions

        self.engine.backend = self._masked if w.forced else self._plain
        opts = TranslateOptions(beam_size=w.beam, max_length=w.max_len)
        out = self.engine.translate([TranslateItem(t, opts) for t in texts])
        errors = [r for r in out if isinstance(r, Exception)]
        if errors:
            raise errors[0]
        return [r.hypotheses[0].text for r in out], sum(r.n_output_tokens for r in out)


class OursHTTP:
    """Our service over HTTP: one POST /v1/translate per batch (natural decoding only)."""

    def __init__(self, base_url: str, name: str = "ours HTTP (int8)") -> None:
        import httpx

        self.name = name
        self.client = httpx.Client(base_url=base_url, timeout=600)

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        if w.forced:
            raise NotImplementedError("the service has no option to suppress </s>")
        r = self.client.post(
            "/v1/translate", json={"text": list(texts), "beam_size": w.beam, "max_length": w.max_len}
        )
        r.raise_for_status()
        return parse_translate_response(r.json())


def parse_translate_response(body: dict[str, Any]) -> tuple[list[str], int]:
    """Texts and output-token count from our /v1/translate answer."""
    texts = [(t.get("hypotheses") or [{}])[0].get("text", "") for t in body.get("translations", [])]
    return texts, int(body.get("usage", {}).get("output_tokens", 0))


# --- measurement -------------------------------------------------------------------------------


def batches(texts: Sequence[str], codec: TextCodec, size: int) -> list[list[int]]:
    """Index batches of ``size`` over length-sorted sentences (the same for every system)."""
    lengths = [len(x) for x in codec.encode(texts)]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    return [order[i : i + size] for i in range(0, len(order), size)]


def natural_max_len(texts: Sequence[str], codec: TextCodec) -> int:
    return min(256, 2 * max(len(x) for x in codec.encode(texts)) + 10)


def throughput(
    system: Translator, texts: Sequence[str], w: Workload, codec: TextCodec, warm_up: bool = True
) -> tuple[float, list[str], float, float]:
    """(target tokens/s, outputs in input order, seconds, cores used by this process) over ``texts``.

    Cores used = process CPU time / wall time: below the thread count when the system was
    starved by other load on the machine (or, for HTTP, the client's share only).
    """
    outputs = [""] * len(texts)
    tokens, seconds, cpu = 0, 0.0, 0.0
    if warm_up:
        warm = Workload(w.beam, 1, min(w.max_len, 8) if w.forced else 8, w.forced)
        system.translate(texts[: min(2, len(texts))], warm)
    for idx in batches(texts, codec, w.batch):
        chunk = [texts[i] for i in idx]
        wl = w if w.forced else Workload(w.beam, w.batch, natural_max_len(chunk, codec), False)
        t0, c0 = time.perf_counter(), time.process_time()
        out, n = system.translate(chunk, wl)
        seconds += time.perf_counter() - t0
        cpu += time.process_time() - c0
        tokens += n
        for i, o in zip(idx, out, strict=True):
            outputs[i] = o
    return tokens / seconds, outputs, seconds, cpu / seconds


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score)


def latencies(
    systems: Sequence[Translator], texts: Sequence[str], beam: int, codec: TextCodec, rounds: int
) -> dict[str, list[float]]:
    """Seconds per one-sentence call, no concurrency; the systems take turns on each sentence, so
    load from elsewhere on the machine hits them alike."""
    out: dict[str, list[float]] = {s.name: [] for s in systems}
    for s in systems:
        s.translate(texts[:1], Workload(beam, 1, 8, False))
    for _ in range(rounds):
        for t in texts:
            w = Workload(beam, 1, natural_max_len([t], codec), False)
            for s in systems:
                t0 = time.perf_counter()
                s.translate([t], w)
                out[s.name].append(time.perf_counter() - t0)
    return out


def add_vs(results: Results, section: str, reference: str, key: str) -> None:
    """extra[key] = value / reference's value, for every row of ``section``."""
    rows = [r for r in results.rows if r.section == section]
    ref = next((r for r in rows if r.system == reference), None)
    if ref is None or not ref.value:
        return
    for r in rows:
        r.extra[key] = r.value / ref.value


def run_suite(
    results: Results,
    label: str,
    systems: Sequence[Translator],
    src: Sequence[str],
    refs: Sequence[str] | None,
    codec: TextCodec,
    workloads: Sequence[tuple[Workload, int]],  # (workload, number of sentences)
    short: Sequence[str] = (),
    rounds: int = 1,
) -> None:
    """Every workload on every system, ``rounds`` times in turn, keeping each system's best run
    (the least disturbed by other load); BLEU of the natural runs when refs are given."""
    for w, n in workloads:
        mode = f"forced {w.max_len} tok" if w.forced else "natural"
        section = f"translate {label}: beam {w.beam}, batch {w.batch}, {mode}, {n} sent."
        best: dict[str, tuple[float, list[str], float, float]] = {}
        failed: set[str] = set()
        for r in range(rounds):
            for system in systems:
                if system.name in failed:
                    continue
                try:
                    run = throughput(system, src[:n], w, codec, warm_up=r == 0)
                except NotImplementedError:
                    failed.add(system.name)
                    continue
                except Exception as e:
                    failed.add(system.name)
                    results.note(f"{section}: {system.name} failed: {type(e).__name__}: {e}")
                    continue
                if system.name not in best or run[0] > best[system.name][0]:
                    best[system.name] = run
        for system in systems:
            if system.name not in best:
                continue
            tps, outputs, secs, cores = best[system.name]
            extra: dict[str, Any] = {"seconds": round(secs, 2)}
            if not isinstance(system, OursHTTP):  # over HTTP this process is only the client
                extra["cores_used"] = round(cores, 2)
            if refs is not None and not w.forced:
                extra["bleu"] = round(bleu(outputs, refs[:n]), 2)
            results.add(
                Row(section, system.name, tps, "tok/s", baseline=system.name == BASELINE, extra=extra)
            )
        add_vs(results, section, CT2_INT8, "x_ct2_int8")
    if short:
        section = f"translate {label}: latency of single short requests, beam 4, {len(short)} × {rounds} req."
        try:
            lat = latencies(systems, short, 4, codec, rounds)
        except Exception as e:
            results.note(f"{section}: failed: {type(e).__name__}: {e}")
            return
        for system in systems:
            p = percentiles_ms(lat[system.name])
            results.add(
                Row(
                    section,
                    system.name,
                    p["p50_ms"],
                    "ms p50",
                    baseline=system.name == BASELINE,
                    higher_is_better=False,
                    extra={"p99_ms": round(p["p99_ms"], 1)},
                )
            )
