"""Stage ``translation``: our checkpoint in HF generate, CTranslate2, our engine and our service.

Batches are formed once, from length-sorted sentences, and every system decodes the same
batches in the same order. Throughput is target tokens/s (generated tokens, without the start
token and ``</s>``); BLEU of the natural runs against Multi30k's references; latency of single
short requests, the systems taking turns. ``run_suite`` is shared with the base-Marian stage.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks import kernels
from benchmarks import translators as tr
from benchmarks.common import CpuMeter, percentiles_ms
from benchmarks.harness import Bench, Need, Stage
from benchmarks.results import Figure, Results, Row
from benchmarks.timed_pass import Run, natural_max_len, throughput
from benchmarks.translators import (
    BASELINE,
    CT2_INT8,
    CT2_INT8_CONFIGS,
    CT2_INT8_REPLICAS,
    TextCodec,
    Translator,
    Workload,
)

OURS_INT8 = "ours in-process (int8)"
OURS_HTTP = "ours HTTP (int8)"
BEAM4_BATCH32 = Workload(4, 32, 0, False)
BEAM4_BATCH32_FORCED = Workload(4, 32, 20, True)


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score)


def latencies(
    systems: Sequence[Translator], texts: Sequence[str], beam: int, codec: TextCodec, rounds: int
) -> dict[str, tuple[list[float], float]]:
    """Per system: seconds per one-sentence call, no concurrency, and the server's total CPU
    seconds over those calls (0 in-process). The systems take turns on each sentence, so load
    from elsewhere on the machine hits them alike."""
    out: dict[str, tuple[list[float], float]] = {s.name: ([], 0.0) for s in systems}
    meters = {s.name: CpuMeter(s.server_pids) for s in systems if s.server_pids}
    for s in systems:
        s.translate(texts[:1], Workload(beam, 1, 8, False))
    for _ in range(rounds):
        for t in texts:
            w = Workload(beam, 1, natural_max_len([t], codec), False)
            for s in systems:
                meter = meters.get(s.name)
                c0 = meter.cpu_seconds() if meter else 0.0
                t0 = time.perf_counter()
                s.translate([t], w)
                seconds = time.perf_counter() - t0
                times, server_cpu = out[s.name]
                times.append(seconds)
                out[s.name] = (times, server_cpu + (meter.cpu_seconds() - c0 if meter else 0.0))
    return out


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
    figures: Mapping[tuple[Workload, str], Figure] | None = None,  # (workload, system) → key
    latency_figures: Mapping[str, Figure] | None = None,  # system → key of its short-request p50
) -> None:
    """Every workload on every system, ``rounds`` times in turn, keeping each system's best run
    (the least disturbed by other load); BLEU of the natural runs when refs are given.
    CTranslate2 int8's faster configuration is filed under ``CT2_INT8`` in both mappings."""
    figures = figures or {}
    latency_figures = latency_figures or {}
    for w, n in workloads:
        mode = f"forced {w.max_len} tok" if w.forced else "natural"
        section = f"translate {label}: beam {w.beam}, batch {w.batch}, {mode}, {n} sent."
        best: dict[str, Run] = {}
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
                if system.name not in best or run.tokens_per_s > best[system.name].tokens_per_s:
                    best[system.name] = run
        # CTranslate2 int8's faster configuration is the reference ("× CT2 int8")
        ct2, filed = _filed({name: run.tokens_per_s for name, run in best.items()}, max)

        rows: list[Row] = []
        for system in systems:
            if system.name not in best:
                continue
            run = best[system.name]
            extra: dict[str, Any] = {"seconds": round(run.seconds, 2)}
            if run.server_cpu_ms_per_request is None:  # over HTTP this process is only the client
                extra["cores_used"] = round(run.cores_used, 2)
            else:
                extra["server_cpu_ms_per_request"] = round(run.server_cpu_ms_per_request, 1)
            if refs is not None and not w.forced:
                extra["bleu"] = round(bleu(run.outputs, refs[:n]), 2)
            row = Row(
                section,
                system.name,
                run.tokens_per_s,
                "tok/s",
                baseline=system.name == BASELINE,
                extra=extra,
                figure=figures.get((w, filed[system.name])) if system.name in filed else None,
            )
            rows.append(results.add(row))
        if ct2 is not None and best[ct2].tokens_per_s:
            for row in rows:
                row.extra["x_ct2_int8"] = row.value / best[ct2].tokens_per_s
    if short:
        section = f"translate {label}: latency of single short requests, beam 4, {len(short)} × {rounds} req."
        try:
            lat = latencies(systems, short, 4, codec, rounds)
        except Exception as e:
            results.note(f"{section}: failed: {type(e).__name__}: {e}")
            return
        _, filed = _filed({name: percentiles_ms(times)["p50_ms"] for name, (times, _) in lat.items()}, min)
        for system in systems:
            times, server_cpu = lat[system.name]
            p = percentiles_ms(times)
            extra = {"p99_ms": round(p["p99_ms"], 1)}
            if system.server_pids:
                extra["server_cpu_ms_per_request"] = round(1000 * server_cpu / len(times), 1)
            results.add(
                Row(
                    section,
                    system.name,
                    p["p50_ms"],
                    "ms p50",
                    baseline=system.name == BASELINE,
                    higher_is_better=False,
                    extra=extra,
                    figure=latency_figures.get(filed[system.name]) if system.name in filed else None,
                )
            )


def _filed(measured: Mapping[str, float], faster: Callable[..., str]) -> tuple[str | None, dict[str, str]]:
    """The name each measured system's figure is filed under: CTranslate2 int8's faster
    configuration (``faster``: ``max`` of throughputs, ``min`` of latencies) under ``CT2_INT8``,
    the slower one under none, every other system under its own; and that faster one."""
    ct2 = faster((n for n in measured if n in CT2_INT8_CONFIGS), key=measured.__getitem__, default=None)
    filed = {name: name for name in measured if name not in CT2_INT8_CONFIGS}
    if ct2 is not None:
        filed[ct2] = CT2_INT8
    return ct2, filed


def ct2_systems(paths: Mapping[str, Any], codec: TextCodec, threads: int) -> list[Translator]:
    """CTranslate2 fp32, and int8 both with ``threads`` intra-op threads and as ``threads``
    single-threaded replicas (on the 2-core box, 2 intra-op threads ran slower than one)."""
    return [
        tr.CTranslate2(paths["ct2-float32"], codec, threads, "CTranslate2 fp32"),
        tr.CTranslate2(paths["ct2-int8"], codec, threads, CT2_INT8),
        tr.CTranslate2(paths["ct2-int8"], codec, threads, CT2_INT8_REPLICAS, replicas=True),
    ]


def run(bench: Bench) -> None:
    """Our checkpoint: natural decoding at beam 1/4 × batch 1/32, forced 20 tokens, latency."""
    from tokenizers import Tokenizer

    from export.sources.ours.checkpoint import read_config

    if bench.small is None:  # its preparation failed, with a note
        return
    paths, ckpt = bench.small, bench.args.checkpoint
    cfg = read_config(ckpt)
    tok = Tokenizer.from_file(str(ckpt.parent / "tokenizer.json"))
    codec = TextCodec(tok, eos_id=cfg.eos_id, pad_id=cfg.pad_id)
    systems: list[Translator] = [tr.HFGenerate(paths["hf"], codec, bench.threads)]
    systems += ct2_systems(paths, codec, bench.threads)
    for v in ("fp32", "int8"):
        if f"small/{v}" in bench.models:
            systems += bench.system(
                tr.OursInProcess, bench.models[f"small/{v}"], bench.threads, f"ours in-process ({v})"
            )
    if bench.service is not None and "small/int8" in bench.models:
        systems.append(tr.OursHTTP(bench.service.base, bench.service.pid, OURS_HTTP))
    n_big, n_one = (200, 24) if bench.quick else (1000, 200)
    src, ref = bench.test_set(n_big)
    W = Workload
    workloads = [
        (W(1, 1, 0, False), n_one),
        (W(4, 1, 0, False), n_one),
        (W(1, 32, 0, False), n_big),
        (BEAM4_BATCH32, n_big),
        (BEAM4_BATCH32_FORCED, min(n_big, 96 if bench.quick else 500)),
    ]
    short = [s for s in src if len(s.split()) <= 8][: 10 if bench.quick else 50]
    print("== translation: our checkpoint", flush=True)
    label = (
        f"{ckpt.parent.name} (d{cfg.d_model}, {cfg.n_encoder_layers}+"
        f"{cfg.n_decoder_layers}, vocab {cfg.vocab_size})"
    )
    run_suite(
        bench.results,
        label,
        systems,
        src,
        ref,
        codec,
        workloads,
        short,
        rounds=bench.rounds,
        figures={
            (BEAM4_BATCH32, OURS_INT8): Figure.SMALL_BEAM4_BATCH32_OURS_INT8,
            (BEAM4_BATCH32, CT2_INT8): Figure.SMALL_BEAM4_BATCH32_CT2_INT8,
            (BEAM4_BATCH32_FORCED, OURS_INT8): Figure.SMALL_FORCED20_OURS_INT8,
            (BEAM4_BATCH32_FORCED, CT2_INT8): Figure.SMALL_FORCED20_CT2_INT8,
        },
        latency_figures={
            OURS_INT8: Figure.SHORT_P50_OURS_INT8,
            OURS_HTTP: Figure.SHORT_P50_OURS_HTTP,
            CT2_INT8: Figure.SHORT_P50_CT2_INT8,
        },
    )
    if "small/int8" in bench.models:
        ct2 = tr.CTranslate2(paths["ct2-int8"], codec, 1, kernels.CT2_ONE_THREAD)
        ours = tr.OursInProcess(bench.models["small/int8"], 1, kernels.OURS_ONE_THREAD)
        graphs = kernels.time_graphs(ours.engine)
        kernels.kernel_bound(
            bench.results,
            label,
            ct2,
            ours,
            graphs,
            [
                (
                    BEAM4_BATCH32,
                    src,
                    Figure.KERNELS_BATCH32_CT2_INT8,
                    Figure.KERNELS_BATCH32_OURS_WHOLE,
                    Figure.KERNELS_BATCH32_OURS_GRAPHS,
                ),
                (
                    W(4, 1, 0, False),
                    src[:n_one],
                    Figure.KERNELS_ONE_CT2_INT8,
                    Figure.KERNELS_ONE_OURS_WHOLE,
                    Figure.KERNELS_ONE_OURS_GRAPHS,
                ),
            ],
            codec,
            bench.rounds,
        )
    del systems
    gc.collect()


STAGE = Stage("translation", "translation", frozenset({Need.OUR_CHECKPOINT, Need.SERVICE}), run)
