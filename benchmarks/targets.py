"""The targets of issue 7 against this run's figures, added as the report's last section."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.results import Figure, Results, Row

SECTION = "targets (issue 7): where we stand"


@dataclass(frozen=True)
class Target:
    what: str
    figure: Figure
    over: Figure | None  # the ratio figure / over; None: the figure itself
    unit: str
    bound: float
    at_least: bool  # value ≥ bound is met; otherwise value ≤ bound
    read: Callable[[Row], float] = lambda row: row.value

    def value(self, results: Results) -> float | None:
        """This run's value, or None when a figure it needs was not measured."""
        row = results.figure(self.figure)
        if row is None:
            return None
        if self.over is None:
            return self.read(row)
        under = results.figure(self.over)
        return row.value / under.value if under is not None and under.value else None


F = Figure
TARGETS = (
    Target(
        "translate, our model: ours int8 / CTranslate2 int8, beam 4, batch 32",
        F.SMALL_BEAM4_BATCH32_OURS_INT8,
        F.SMALL_BEAM4_BATCH32_CT2_INT8,
        "×",
        1.2,
        True,
    ),
    Target(
        "translate, base Marian (forced 20 tok): ours int8 / CTranslate2 int8, beam 4, batch 32",
        F.BASE_BEAM4_BATCH32_OURS_INT8,
        F.BASE_BEAM4_BATCH32_CT2_INT8,
        "×",
        1.2,
        True,
    ),
    Target(
        "embed, 32-sentence requests over HTTP / sentence-transformers",
        F.EMBED_HTTP_4_CLIENTS_32,
        F.EMBED_SENTENCE_TRANSFORMERS,
        "×",
        3.0,
        True,
    ),
    Target(
        "embed, 64 clients × 1 sentence: ours HTTP / Infinity",
        F.EMBED_HTTP_64_CLIENTS,
        F.EMBED_INFINITY_64_CLIENTS,
        "×",
        4.0,
        True,
    ),
    Target(
        "embed, 64 clients × 1 sentence: ours HTTP p99",
        F.EMBED_HTTP_64_CLIENTS,
        None,
        "ms",
        500,
        False,
        read=lambda row: float(row.extra["p99_ms"]),
    ),
    Target("embed in-process: ours int8 / ours fp32", F.EMBED_OURS_INT8, F.EMBED_OURS_FP32, "×", 1.0, True),
    Target(
        "embed, HTTP at 64 clients / in-process engine",
        F.EMBED_VS_ENGINE_HTTP,
        F.EMBED_VS_ENGINE_IN_PROCESS,
        "×",
        0.9,
        True,
    ),
    Target("embed: dynamic batching / batch size 1", F.EMBED_DYNAMIC, F.EMBED_SERIAL, "×", 5.0, True),
    Target(
        "translate: dynamic batching / batch size 1", F.TRANSLATE_DYNAMIC, F.TRANSLATE_SERIAL, "×", 5.0, True
    ),
    Target("service RSS, both models, after its load runs", F.SERVICE_RSS_AFTER_LOAD, None, "MB", 600, False),
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
                    "target": f"{'≥' if target.at_least else '≤'} {target.bound:g}",
                    "met": "yes" if met else "NO",
                },
            )
        )
