"""The open targets against this run's figures, and the floors measured on this hardware.

Every target is a ratio of two figures measured in the same run (a memory budget: one figure in
MB), so that a busy or a different machine moves both sides alike. A target whose bound lies
beyond what this hardware allows whatever the code does is no target: it leaves the table, and
the floor that shows why stays in the report as a measured row of its own section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.results import Figure, Results, Row

TARGETS_SECTION = "open targets: where this run stands"
FLOORS_SECTION = "floors measured on this hardware"


@dataclass(frozen=True)
class Read:
    """One number of a figure's row: its value, or one of its columns (``extra``)."""

    figure: Figure
    column: str | None = None

    def value(self, results: Results) -> float | None:
        """None when this run did not measure the figure, or its row lacks the column (a run
        with no successful request) or holds NaN there."""
        row = results.figure(self.figure)
        if row is None:
            return None
        number = row.value if self.column is None else row.extra.get(self.column)
        if number is None or math.isnan(float(number)):
            return None
        return float(number)


@dataclass(frozen=True)
class Ratio:
    """``of`` / ``over``, both of this run; ``over`` None: ``of`` alone, in its own unit."""

    what: str
    of: Read
    over: Read | None
    unit: str

    def value(self, results: Results) -> float | None:
        """This run's value, or None when a number it needs was not measured (or ``over`` is 0)."""
        of = self.of.value(results)
        if of is None or self.over is None:
            return of
        over = self.over.value(results)
        return of / over if over else None


@dataclass(frozen=True)
class Target(Ratio):
    bound: float
    at_least: bool  # value ≥ bound is met; otherwise value ≤ bound

    def met(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound

    @property
    def bound_text(self) -> str:
        return f"{'≥' if self.at_least else '≤'} {self.bound:g}"


@dataclass(frozen=True)
class Floor(Ratio):
    bounds: str  # the target it bounds: a retired one, or an open one it shows the limit of


F = Figure
CT2_BEST = "CTranslate2 int8 at its best (intra-op threads or replicas)"
ONE_THREAD = "1 thread, beam 4"
TARGETS = (
    Target(
        "markup, a dictionary term in <b>: HTML outputs whose text is the plain translation's (%)",
        Read(F.MARKUP_HTML, "identical_text_pct"),
        None,
        "%",
        100,
        True,
    ),
    Target(
        "markup, a dictionary term in <b>: <b> on the target term, of the outputs holding it (%)",
        Read(F.MARKUP_HTML, "bold_on_term_pct"),
        None,
        "%",
        90,
        True,
    ),
    Target(
        "markup, a dictionary term in <b>: the cost of the HTML against plain text (sent/s plain / HTML)",
        Read(F.MARKUP_PLAIN),
        Read(F.MARKUP_HTML),
        "×",
        1.1,
        False,
    ),
    Target(
        "terminology, terms the model never wrote, placed by alignment: the terms present (%)",
        Read(F.TERMS_UNSEEN_PLACED, "term_accuracy_pct"),
        None,
        "%",
        100,
        True,
    ),
    Target(
        "terminology, terms the model never wrote, placed by alignment: sentences with a term bolted on (%)",
        Read(F.TERMS_UNSEEN_PLACED, "bolted_on_pct"),
        None,
        "%",
        3,
        False,
    ),
    Target(
        "terminology, terms the model never wrote, placed by alignment: the cost against the free search "
        "(sent/s free / placed)",
        Read(F.TERMS_UNSEEN_FREE),
        Read(F.TERMS_UNSEEN_PLACED),
        "×",
        1.5,
        False,
    ),
    Target(
        f"translate, our model, beam 4, batch 32: ours int8 / {CT2_BEST} (tok/s)",
        Read(F.SMALL_BEAM4_BATCH32_OURS_INT8),
        Read(F.SMALL_BEAM4_BATCH32_CT2_INT8),
        "×",
        1.2,
        True,
    ),
    Target(
        f"translate, base-sized Marian, beam 4, batch 32, forced 20 tokens: ours int8 / {CT2_BEST} (tok/s)",
        Read(F.BASE_BEAM4_BATCH32_OURS_INT8),
        Read(F.BASE_BEAM4_BATCH32_CT2_INT8),
        "×",
        1.2,
        True,
    ),
    Target(
        f"the decode loop's share, {ONE_THREAD}, batch 32: our whole decode / our graphs' runs alone (tok/s)",
        Read(F.KERNELS_BATCH32_OURS_WHOLE),
        Read(F.KERNELS_BATCH32_OURS_GRAPHS),
        "×",
        0.9,
        True,
    ),
    Target(
        f"the decode loop's share, {ONE_THREAD}, one sentence at a time: our whole decode / our graphs' "
        "runs alone (tok/s)",
        Read(F.KERNELS_ONE_OURS_WHOLE),
        Read(F.KERNELS_ONE_OURS_GRAPHS),
        "×",
        0.9,
        True,
    ),
    Target(
        f"one short request, beam 4, in-process p50: ours int8 / {CT2_BEST}",
        Read(F.SHORT_P50_OURS_INT8),
        Read(F.SHORT_P50_CT2_INT8),
        "×",
        1.0,
        False,
    ),
    Target(
        "host side, free onnxruntime runs, CPU layout, beam 4, batch 128: µs a sentence-step",
        Read(F.HOST_CPU_BATCH128),
        None,
        "µs",
        6,
        False,
    ),
    Target(
        "host side, free onnxruntime runs, device layout, beam 4, batch 128: µs a sentence-step",
        Read(F.HOST_DEVICE_BATCH128),
        None,
        "µs",
        6,
        False,
    ),
    Target(
        "host side, free onnxruntime runs, CPU layout, beam 4, one sentence: ms a step",
        Read(F.HOST_CPU_ONE),
        None,
        "ms",
        0.15,
        False,
    ),
    Target(
        "host side, free onnxruntime runs, device layout, beam 4, one sentence: ms a step",
        Read(F.HOST_DEVICE_ONE),
        None,
        "ms",
        0.15,
        False,
    ),
    Target(
        "device layout: onnxruntime runs per decoder step (the decoder and the cache's moves)",
        Read(F.HOST_DEVICE_RUNS),
        None,
        "runs",
        1,
        False,
    ),
    Target(
        "embed, 64 clients × 1 sentence over HTTP: ours / the bare-handler floor (sentences/s)",
        Read(F.EMBED_HTTP_64_CLIENTS),
        Read(F.EMBED_FLOOR_64_CLIENTS),
        "×",
        0.9,
        True,
    ),
    Target(
        "embed, compute replayed, device path: host CPU a sentence in-process at batch 128",
        Read(F.HOST_EMBED_IN_PROCESS_DEVICE),
        None,
        "µs",
        15,
        False,
    ),
    Target(
        "embed, compute replayed, device path: server CPU a sentence over HTTP, 4 clients × 128",
        Read(F.HOST_EMBED_HTTP_4X128_DEVICE, "server_cpu_us_per_sentence"),
        None,
        "µs",
        40,
        False,
    ),
    Target(
        "embed, compute replayed, device path, 64 clients × 1 over HTTP: 2 serving processes / 1",
        Read(F.HOST_EMBED_HTTP_64X1_DEVICE_2_PROCESSES),
        Read(F.HOST_EMBED_HTTP_64X1_DEVICE),
        "×",
        1.6,
        True,
    ),
    Target(
        "continuous decoding, short-request p99: mixed traffic / no long inputs (16 clients of captions)",
        Read(F.MIXED_SHORT_P99_CONTINUOUS),
        Read(F.UNIFORM_CONTINUOUS, "p99_ms"),
        "×",
        1.1,
        False,
    ),
    Target(
        "service RSS, the three default models, peak under their load",
        Read(F.SERVICE_RSS_THREE_MODELS_PEAK),
        None,
        "MB",
        500,
        False,
    ),
    Target(
        "service RSS, the translator and the embedder, after the load runs",
        Read(F.SERVICE_RSS_AFTER_LOAD),
        None,
        "MB",
        400,
        False,
    ),
)

RETIRED = "(retired)"
FLOORS = (
    Floor(
        "embed, 64 clients × 1 sentence: the bare handler over HTTP / the engine in-process (sentences/s)",
        Read(F.EMBED_FLOOR_64_CLIENTS),
        Read(F.EMBED_OURS_INT8),
        "×",
        f"ours over HTTP / in-process ≥ 0.7 and ≥ 0.9 {RETIRED}",
    ),
    Floor(
        "embed, 64 clients × 1 sentence: dynamic batching / batch size 1 (sentences/s)",
        Read(F.EMBED_DYNAMIC),
        Read(F.EMBED_SERIAL),
        "×",
        f"≥ 5 {RETIRED}",
    ),
    Floor(
        "translate, one short sentence a request: dynamic batching / batch size 1 (requests/s)",
        Read(F.TRANSLATE_DYNAMIC),
        Read(F.TRANSLATE_SERIAL),
        "×",
        f"≥ 5 {RETIRED}",
    ),
    Floor(
        "short-request p99: continuous with no long inputs / whole-batch's mixed traffic",
        Read(F.UNIFORM_CONTINUOUS, "p99_ms"),
        Read(F.MIXED_SHORT_P99_BATCH),
        "×",
        f"continuous / whole-batch, mixed traffic ≤ 0.5 {RETIRED}",
    ),
    Floor(
        f"{ONE_THREAD}, batch 32: our graphs' runs alone / CTranslate2 int8's whole decode (tok/s)",
        Read(F.KERNELS_BATCH32_OURS_GRAPHS),
        Read(F.KERNELS_BATCH32_CT2_INT8),
        "×",
        "ours int8 / CTranslate2 int8, batch 32 ≥ 1.2",
    ),
    Floor(
        f"{ONE_THREAD}, one sentence at a time: our graphs' runs alone / CTranslate2 int8's whole decode "
        "(tok/s)",
        Read(F.KERNELS_ONE_OURS_GRAPHS),
        Read(F.KERNELS_ONE_CT2_INT8),
        "×",
        "one short request ≤ CTranslate2's best",
    ),
)


def check_targets(results: Results) -> None:
    """A row per open target (its value, bound and whether it is met; a value this run did not
    measure reads as not measured), then a row per floor."""
    for target in TARGETS:
        value = target.value(results)
        met = "–" if value is None else "yes" if target.met(value) else "NO"
        results.add(
            Row(
                TARGETS_SECTION,
                target.what,
                math.nan if value is None else value,
                target.unit,
                higher_is_better=target.at_least,
                extra={"target": target.bound_text, "met": met},
            )
        )
    for floor in FLOORS:
        value = floor.value(results)
        measured = math.nan if value is None else value
        results.add(Row(FLOORS_SECTION, floor.what, measured, floor.unit, extra={"bounds": floor.bounds}))
