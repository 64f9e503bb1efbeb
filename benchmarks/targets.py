"""The issues' acceptance figures against this run's, added as the report's last section."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.results import Figure, Results, Row

SECTION = "targets of the issues: where this run stands"


@dataclass(frozen=True)
class Target:
    issue: int
    what: str
    figure: Figure
    over: Figure | None  # combined with the figure (``combine``, a ratio unless told); None: none
    unit: str
    bound: float
    at_least: bool  # value ≥ bound is met; otherwise value ≤ bound
    read: Callable[[Row], float] = lambda row: row.value
    combine: Callable[[float, float], float] = operator.truediv

    def value(self, results: Results) -> float | None:
        """This run's value, or None when a figure it needs was not measured."""
        row = results.figure(self.figure)
        if row is None:
            return None
        try:
            value = self.read(row)
        except KeyError:  # a row without that column (its run had no successful request)
            return None
        if self.over is None:
            return value
        under = results.figure(self.over)
        if under is None or (self.combine is operator.truediv and not under.value):
            return None
        return self.combine(value, under.value)


def _column(name: str) -> Callable[[Row], float]:
    """Read a target's value from a column of its row instead of the row's value."""
    return lambda row: float(row.extra[name])


F = Figure
TARGETS = (
    # issue 7: the first service
    Target(
        7,
        "translate, our model: ours int8 / CTranslate2 int8, beam 4, batch 32",
        F.SMALL_BEAM4_BATCH32_OURS_INT8,
        F.SMALL_BEAM4_BATCH32_CT2_INT8,
        "×",
        1.2,
        True,
    ),
    Target(
        7,
        "translate, base Marian (forced 20 tok): ours int8 / CTranslate2 int8, beam 4, batch 32",
        F.BASE_BEAM4_BATCH32_OURS_INT8,
        F.BASE_BEAM4_BATCH32_CT2_INT8,
        "×",
        1.2,
        True,
    ),
    Target(
        7,
        "embed, 32-sentence requests over HTTP / sentence-transformers",
        F.EMBED_HTTP_4_CLIENTS_32,
        F.EMBED_SENTENCE_TRANSFORMERS,
        "×",
        3.0,
        True,
    ),
    Target(
        7,
        "embed, 64 clients × 1 sentence: ours HTTP / Infinity",
        F.EMBED_HTTP_64_CLIENTS,
        F.EMBED_INFINITY_64_CLIENTS,
        "×",
        4.0,
        True,
    ),
    Target(
        7,
        "embed, 64 clients × 1 sentence: ours HTTP p99",
        F.EMBED_HTTP_64_CLIENTS,
        None,
        "ms",
        500,
        False,
        read=_column("p99_ms"),
    ),
    Target(
        7, "embed in-process: ours int8 / ours fp32", F.EMBED_OURS_INT8, F.EMBED_OURS_FP32, "×", 1.0, True
    ),
    Target(
        7,
        "embed, HTTP at 64 clients / in-process engine",
        F.EMBED_VS_ENGINE_HTTP,
        F.EMBED_VS_ENGINE_IN_PROCESS,
        "×",
        0.9,
        True,
    ),
    Target(7, "embed: dynamic batching / batch size 1", F.EMBED_DYNAMIC, F.EMBED_SERIAL, "×", 5.0, True),
    Target(
        7,
        "translate: dynamic batching / batch size 1",
        F.TRANSLATE_DYNAMIC,
        F.TRANSLATE_SERIAL,
        "×",
        5.0,
        True,
    ),
    Target(
        7, "service RSS, both models, after its load runs", F.SERVICE_RSS_AFTER_LOAD, None, "MB", 600, False
    ),
    # issue 12: translation engine v2
    Target(
        12,
        "our model, beam 4, batch 32, natural: ours int8 / CTranslate2 int8",
        F.SMALL_BEAM4_BATCH32_OURS_INT8,
        F.SMALL_BEAM4_BATCH32_CT2_INT8,
        "×",
        1.5,
        True,
    ),
    Target(
        12,
        "our model, beam 4, batch 32, forced 20 tok: ours int8 / CTranslate2 int8",
        F.SMALL_FORCED20_OURS_INT8,
        F.SMALL_FORCED20_CT2_INT8,
        "×",
        1.5,
        True,
    ),
    Target(
        12,
        "one short request, beam 4, in-process p50: ours int8 / CTranslate2 int8",
        F.SHORT_P50_OURS_INT8,
        F.SHORT_P50_CT2_INT8,
        "×",
        1.0,
        False,
    ),
    # the same ratios' ceiling without any Python around the graphs (benchmarks/kernels.py)
    Target(
        12,
        "beam 4, batch 32, 1 thread: our graphs' runs alone / CTranslate2 int8's whole decode",
        F.KERNELS_BATCH32_OURS_GRAPHS,
        F.KERNELS_BATCH32_CT2_INT8,
        "×",
        1.5,
        True,
    ),
    Target(  # a time ratio: CTranslate2's tok/s over the graphs' alone
        12,
        "beam 4, one sentence at a time, 1 thread: our graphs' runs alone, time / CTranslate2 int8's",
        F.KERNELS_ONE_CT2_INT8,
        F.KERNELS_ONE_OURS_GRAPHS,
        "×",
        1.0,
        False,
    ),
    Target(
        12,
        "service RSS, both models, after its load runs (≤ 400 MB)",
        F.SERVICE_RSS_AFTER_LOAD,
        None,
        "MB",
        400,
        False,
    ),
    # issue 13: the serving path's cost per request
    Target(
        13,
        "embed, 64 clients × 1 sentence over HTTP / in-process engine (stage embedding)",
        F.EMBED_HTTP_64_CLIENTS,
        F.EMBED_OURS_INT8,
        "×",
        0.7,
        True,
    ),
    Target(  # the same with nothing but JSON, tokenizing and batching on the path: its ceiling
        13,
        "embed, 64 clients × 1 sentence, a bare handler over HTTP / in-process engine (stage embedding)",
        F.EMBED_FLOOR_64_CLIENTS,
        F.EMBED_OURS_INT8,
        "×",
        0.7,
        True,
    ),
    Target(
        13,
        "embed, 64 clients × 1 sentence over HTTP / in-process engine (stage serving)",
        F.EMBED_VS_ENGINE_HTTP,
        F.EMBED_VS_ENGINE_IN_PROCESS,
        "×",
        0.7,
        True,
    ),
    Target(
        13,
        "embed, 64 clients × 1 sentence: server CPU per request",
        F.EMBED_HTTP_64_CLIENTS,
        None,
        "ms",
        1.5,
        False,
        read=_column("server_cpu_ms_per_request"),
    ),
    Target(
        13,
        "one short translation: p50 over HTTP − p50 in-process",
        F.SHORT_P50_OURS_HTTP,
        F.SHORT_P50_OURS_INT8,
        "ms",
        3.0,
        False,
        combine=operator.sub,
    ),
    Target(
        13,
        "embed, 1 client × 1 sentence over HTTP: p50",
        F.EMBED_HTTP_1_CLIENT,
        None,
        "ms",
        4.0,
        False,
        read=_column("p50_ms"),
    ),
    # issue 16: several translation models in one service
    Target(
        16,
        "service RSS, the three default models, peak under their load",
        F.SERVICE_RSS_THREE_MODELS_PEAK,
        None,
        "MB",
        500,
        False,
    ),
    # issue 17: iteration-level batching
    Target(
        17,
        "mixed traffic, short-request p99: continuous / whole-batch",
        F.MIXED_SHORT_P99_CONTINUOUS,
        F.MIXED_SHORT_P99_BATCH,
        "×",
        0.5,
        False,
    ),
    Target(  # short requests with nothing long beside them: the least the ratio above can be
        17,
        "short-request p99 with no long inputs (16 clients of captions, continuous) / whole-batch's mixed",
        F.UNIFORM_CONTINUOUS,
        F.MIXED_SHORT_P99_BATCH,
        "×",
        0.5,
        False,
        read=_column("p99_ms"),
    ),
    Target(
        17,
        "mixed traffic, tokens/s: continuous / whole-batch",
        F.MIXED_TOKENS_CONTINUOUS,
        F.MIXED_TOKENS_BATCH,
        "×",
        1.0,
        True,
    ),
    Target(
        17,
        "uniform traffic, requests/s: continuous / whole-batch",
        F.UNIFORM_CONTINUOUS,
        F.UNIFORM_BATCH,
        "×",
        0.95,
        True,
    ),
    Target(17, "hostile load: one-word p99 during it", F.HOSTILE_ONE_WORD_P99, None, "ms", 1000, False),
    Target(
        17,
        "hostile load: one-word p99 right after it",
        F.HOSTILE_ONE_WORD_P99,
        None,
        "ms",
        1000,
        False,
        read=_column("after_p99_ms"),
    ),
)


def check_targets(results: Results) -> None:
    """One row per target whose figures this run measured: the value, the bound, met or NO."""
    for target in TARGETS:
        value = target.value(results)
        if value is None:
            continue
        met = value >= target.bound if target.at_least else value <= target.bound
        results.add(
            Row(
                SECTION,
                target.what,
                value,
                target.unit,
                higher_is_better=target.at_least,
                extra={
                    "issue": target.issue,
                    "target": f"{'≥' if target.at_least else '≤'} {target.bound:g}",
                    "met": "yes" if met else "NO",
                },
            )
        )
