"""The report's targets table: the open targets only, each read from figures of the same run,
and the floors measured on this hardware as rows of their own."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.results import Figure, Results, Row
from benchmarks.targets import FLOORS, FLOORS_SECTION, TARGETS, TARGETS_SECTION, Read, check_targets

F = Figure
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _row(figure: Figure, value: float, **extra: float) -> Row:
    return Row("any title", f"system {figure}", value, "x/s", extra=dict(extra), figure=figure)


def _checked(*rows: Row) -> tuple[dict[str, Row], dict[str, Row]]:
    """The targets' rows and the floors' rows of a run that measured ``rows``, by what they say."""
    results = Results()
    for row in rows:
        results.add(row)
    check_targets(results)
    by_section: dict[str, dict[str, Row]] = {TARGETS_SECTION: {}, FLOORS_SECTION: {}}
    for row in results.rows:
        if row.section in by_section:
            by_section[row.section][row.system] = row
    return by_section[TARGETS_SECTION], by_section[FLOORS_SECTION]


def _target(of: Figure) -> str:
    return next(t.what for t in TARGETS if t.of.figure is of)


def _floor(of: Figure, over: Figure) -> str:
    return next(f.what for f in FLOORS if f.of.figure is of and f.over is not None and f.over.figure is over)


def test_the_table_lists_exactly_the_open_targets() -> None:
    """Issue 43: ours / CTranslate2 at its best on both models, the decode loop's share at batch
    32 and one sentence, one short request, HTTP against its bare-handler floor, continuous
    decoding's short p99 against its no-long-input bound, the two memory budgets; issue 52: the
    host's CPU a sentence with the compute replayed, in-process and over HTTP (device path), and
    two serving processes against one at 64 × 1;
    issue 51: the host's µs a sentence-step at batch 128 and ms a step for one sentence on both
    decoder layouts, and one onnxruntime run per decoder step on the device's; issue 56: the markup
    stage's identical text, <b> on the term and cost against plain text."""
    got = {
        (t.of.figure, t.of.column, t.over.figure if t.over else None, t.over.column if t.over else None): (
            t.bound,
            t.at_least,
        )
        for t in TARGETS
    }
    assert got == {
        (F.MARKUP_HTML, "identical_text_pct", None, None): (100, True),
        (F.MARKUP_HTML, "bold_on_term_pct", None, None): (90, True),
        (F.MARKUP_PLAIN, None, F.MARKUP_HTML, None): (1.1, False),
        (F.TERMS_UNSEEN_PLACED, "term_accuracy_pct", None, None): (100, True),
        (F.TERMS_UNSEEN_PLACED, "bolted_on_pct", None, None): (3, False),
        (F.TERMS_UNSEEN_FREE, None, F.TERMS_UNSEEN_PLACED, None): (1.5, False),
        (F.SMALL_BEAM4_BATCH32_OURS_INT8, None, F.SMALL_BEAM4_BATCH32_CT2_INT8, None): (1.2, True),
        (F.BASE_BEAM4_BATCH32_OURS_INT8, None, F.BASE_BEAM4_BATCH32_CT2_INT8, None): (1.2, True),
        (F.KERNELS_BATCH32_OURS_WHOLE, None, F.KERNELS_BATCH32_OURS_GRAPHS, None): (0.9, True),
        (F.KERNELS_ONE_OURS_WHOLE, None, F.KERNELS_ONE_OURS_GRAPHS, None): (0.9, True),
        (F.SHORT_P50_OURS_INT8, None, F.SHORT_P50_CT2_INT8, None): (1.0, False),
        (F.EMBED_HTTP_64_CLIENTS, None, F.EMBED_FLOOR_64_CLIENTS, None): (0.9, True),
        (F.HOST_CPU_BATCH128, None, None, None): (6, False),
        (F.HOST_DEVICE_BATCH128, None, None, None): (6, False),
        (F.HOST_CPU_ONE, None, None, None): (0.15, False),
        (F.HOST_DEVICE_ONE, None, None, None): (0.15, False),
        (F.HOST_DEVICE_RUNS, None, None, None): (1, False),
        (F.HOST_EMBED_IN_PROCESS_DEVICE, None, None, None): (15, False),
        (F.HOST_EMBED_HTTP_4X128_DEVICE, "server_cpu_us_per_sentence", None, None): (40, False),
        (F.HOST_EMBED_HTTP_64X1_DEVICE_2_PROCESSES, None, F.HOST_EMBED_HTTP_64X1_DEVICE, None): (1.6, True),
        (F.MIXED_SHORT_P99_CONTINUOUS, None, F.UNIFORM_CONTINUOUS, "p99_ms"): (1.1, False),
        (F.SERVICE_RSS_THREE_MODELS_PEAK, None, None, None): (500, False),
        (F.SERVICE_RSS_AFTER_LOAD, None, None, None): (400, False),
    }
    assert len(got) == len(TARGETS) == len({t.what for t in TARGETS})
    targets, floors = _checked()
    assert list(targets) == [t.what for t in TARGETS]  # every one a row, measured or not
    assert list(floors) == [f.what for f in FLOORS]


def test_the_retired_targets_stay_as_floors_not_as_targets() -> None:
    """HTTP ≥ 0.7×/0.9× in-process, dynamic batching ≥ 5× batch size 1, short p99 ≤ 0.5×
    whole-batch: below what this hardware allows, so measured rows without a bound."""
    floors = {(f.of, f.over) for f in FLOORS}
    assert floors == {
        (Read(F.EMBED_FLOOR_64_CLIENTS), Read(F.EMBED_OURS_INT8)),
        (Read(F.EMBED_DYNAMIC), Read(F.EMBED_SERIAL)),
        (Read(F.TRANSLATE_DYNAMIC), Read(F.TRANSLATE_SERIAL)),
        (Read(F.UNIFORM_CONTINUOUS, "p99_ms"), Read(F.MIXED_SHORT_P99_BATCH)),
        (Read(F.KERNELS_BATCH32_OURS_GRAPHS), Read(F.KERNELS_BATCH32_CT2_INT8)),
        (Read(F.KERNELS_ONE_OURS_GRAPHS), Read(F.KERNELS_ONE_CT2_INT8)),
    }
    read_by_targets = {r.figure for t in TARGETS for r in (t.of, t.over) if r}
    retired = {
        F.EMBED_VS_ENGINE_HTTP,
        F.EMBED_OURS_INT8,
        F.EMBED_DYNAMIC,
        F.TRANSLATE_DYNAMIC,
        F.MIXED_SHORT_P99_BATCH,
    }
    assert not read_by_targets & retired
    assert sum("(retired)" in f.bounds for f in FLOORS) == 4


def test_targets_read_figures_by_key_whatever_the_section_titles() -> None:
    targets, _ = _checked(
        _row(F.SMALL_BEAM4_BATCH32_OURS_INT8, 300.0),
        _row(F.SMALL_BEAM4_BATCH32_CT2_INT8, 200.0),
        _row(F.SERVICE_RSS_AFTER_LOAD, 437.0),
        _row(F.SERVICE_RSS_THREE_MODELS_PEAK, 436.0),
    )
    ratio = targets[_target(F.SMALL_BEAM4_BATCH32_OURS_INT8)]
    assert math.isclose(ratio.value, 1.5) and ratio.unit == "×"
    assert ratio.extra == {"target": "≥ 1.2", "met": "yes"}
    budget = targets[_target(F.SERVICE_RSS_AFTER_LOAD)]
    assert budget.value == 437.0 and budget.unit == "MB" and budget.extra == {"target": "≤ 400", "met": "NO"}
    assert targets[_target(F.SERVICE_RSS_THREE_MODELS_PEAK)].extra["met"] == "yes"


def test_an_upper_bound_on_a_ratio_that_reads_a_column() -> None:
    """Continuous decoding's mixed short p99 over its p99 with no long inputs (a column of the
    uniform row, whose value is requests/s)."""
    targets, floors = _checked(
        _row(F.MIXED_SHORT_P99_CONTINUOUS, 150.0),
        _row(F.MIXED_SHORT_P99_BATCH, 177.0),
        _row(F.UNIFORM_CONTINUOUS, 40.0, p99_ms=125.0),
    )
    p99 = targets[_target(F.MIXED_SHORT_P99_CONTINUOUS)]
    assert math.isclose(p99.value, 1.2) and p99.extra == {"target": "≤ 1.1", "met": "NO"}
    assert not p99.higher_is_better
    floor = floors[_floor(F.UNIFORM_CONTINUOUS, F.MIXED_SHORT_P99_BATCH)]
    assert math.isclose(floor.value, 125 / 177) and floor.unit == "×"
    assert "≤ 0.5" in floor.extra["bounds"] and "met" not in floor.extra


def test_a_target_whose_figure_is_missing_reads_as_not_measured() -> None:
    targets, floors = _checked(
        _row(F.SHORT_P50_OURS_INT8, 5.6),  # CTranslate2's p50 missing
        _row(F.UNIFORM_CONTINUOUS, 40.0),  # no p99 column: no successful request
        _row(F.MIXED_SHORT_P99_CONTINUOUS, 150.0),
        _row(F.EMBED_HTTP_64_CLIENTS, 1557.0),
        _row(F.EMBED_FLOOR_64_CLIENTS, math.nan),
    )
    for of in (
        F.SHORT_P50_OURS_INT8,
        F.MIXED_SHORT_P99_CONTINUOUS,
        F.EMBED_HTTP_64_CLIENTS,
        F.SERVICE_RSS_AFTER_LOAD,
    ):
        row = targets[_target(of)]
        assert math.isnan(row.value) and row.extra["met"] == "–", row.system
    assert all(math.isnan(r.value) for r in floors.values())


def test_a_ratio_over_a_zero_figure_is_not_measured() -> None:
    _, floors = _checked(_row(F.EMBED_DYNAMIC, 10.0), _row(F.EMBED_SERIAL, 0.0))
    assert math.isnan(floors[_floor(F.EMBED_DYNAMIC, F.EMBED_SERIAL)].value)


def test_the_report_prints_the_targets_then_the_floors() -> None:
    results = Results()
    for row in (
        _row(F.KERNELS_BATCH32_CT2_INT8, 5400.0),
        _row(F.KERNELS_BATCH32_OURS_WHOLE, 4316.0),
        _row(F.KERNELS_BATCH32_OURS_GRAPHS, 5426.0),
        _row(F.SERVICE_RSS_THREE_MODELS_PEAK, 436.0),
    ):
        results.add(row)
    check_targets(results)
    text = report.markdown(results, {})
    targets, floors = text.split(f"### {TARGETS_SECTION}")[1].split(f"### {FLOORS_SECTION}")
    target_lines = [line for line in targets.splitlines() if line.startswith("| ") and "---" not in line]
    assert target_lines[0] == "| system | value | target | met |"
    assert len(target_lines) == 1 + len(TARGETS)
    share = next(
        line for line in target_lines if line.startswith(f"| {_target(F.KERNELS_BATCH32_OURS_WHOLE)} |")
    )
    assert share.endswith(f"| {4316 / 5426:.2f} × | ≥ 0.9 | NO |")
    assert f"| {_target(F.SERVICE_RSS_THREE_MODELS_PEAK)} | 436 MB | ≤ 500 | yes |" in targets
    assert f"| {_target(F.SHORT_P50_OURS_INT8)} | not measured | ≤ 1 | – |" in targets
    floor_lines = [line for line in floors.splitlines() if line.startswith("| ") and "---" not in line]
    assert floor_lines[0] == "| system | × | the target it bounds |"
    assert len(floor_lines) == 1 + len(FLOORS)
    graphs = _floor(F.KERNELS_BATCH32_OURS_GRAPHS, F.KERNELS_BATCH32_CT2_INT8)
    assert f"| {graphs} | {5426 / 5400:.2f} | ours int8 / CTranslate2 int8, batch 32 ≥ 1.2 |" in floors


@pytest.mark.parametrize(
    "figure", sorted({r.figure for t in (*TARGETS, *FLOORS) for r in (t.of, t.over) if r})
)
def test_every_figure_read_is_filed_by_a_stage(figure: Figure) -> None:
    """A key that no stage files would leave its target not measured in every run."""
    stages = [p for p in BENCHMARKS.rglob("*.py") if p.name not in ("results.py", "targets.py")]
    pattern = re.compile(rf"\b(Figure|F)\.{figure.name}\b")
    assert any(pattern.search(p.read_text()) for p in stages), figure.name
