"""The benchmark's figures: typed keys, the targets read from them, the stage registry."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.__main__ import parse
from benchmarks.harness import Need
from benchmarks.results import Figure, Results, Row
from benchmarks.stages import STAGES
from benchmarks.targets import SECTION, TARGETS, check_targets


def _row(figure: Figure, value: float, **extra: float) -> Row:
    return Row("any title", f"system {figure}", value, "x/s", extra=dict(extra), figure=figure)


def test_targets_read_figures_by_key_whatever_the_section_titles() -> None:
    results = Results()
    results.add(_row(Figure.SMALL_BEAM4_BATCH32_OURS_INT8, 300.0))
    results.add(_row(Figure.SMALL_BEAM4_BATCH32_CT2_INT8, 200.0))
    results.add(_row(Figure.EMBED_HTTP_64_CLIENTS, 150.0, p99_ms=620.0))
    results.add(_row(Figure.SERVICE_RSS_AFTER_LOAD, 437.0))
    check_targets(results)
    got = {(r.extra["issue"], r.system): r for r in results.rows if r.section == SECTION}
    ratio = got[7, "translate, our model: ours int8 / CTranslate2 int8, beam 4, batch 32"]
    assert math.isclose(ratio.value, 1.5) and ratio.extra == {"issue": 7, "target": "≥ 1.2", "met": "yes"}
    assert got[12, "our model, beam 4, batch 32, natural: ours int8 / CTranslate2 int8"].extra["met"] == "yes"
    p99 = got[7, "embed, 64 clients × 1 sentence: ours HTTP p99"]
    assert p99.value == 620.0 and p99.extra == {"issue": 7, "target": "≤ 500", "met": "NO"}
    assert got[7, "service RSS, both models, after its load runs"].extra["met"] == "yes"
    assert got[12, "service RSS, both models, after its load runs (≤ 400 MB)"].extra["met"] == "NO"
    # left out: the targets whose figures, or the columns they read, were not measured (the HTTP
    # row has no server CPU column here)
    assert len(got) == 5


def test_targets_of_a_difference_and_of_an_upper_bound_on_a_ratio() -> None:
    """Issue 13: HTTP p50 − in-process p50 ≤ 3 ms; issue 17: continuous / batch p99 ≤ 0.5."""
    results = Results()
    results.add(_row(Figure.SHORT_P50_OURS_HTTP, 7.3))
    results.add(_row(Figure.SHORT_P50_OURS_INT8, 4.6))
    results.add(_row(Figure.MIXED_SHORT_P99_CONTINUOUS, 150.0))
    results.add(_row(Figure.MIXED_SHORT_P99_BATCH, 177.0))
    check_targets(results)
    got = {r.extra["issue"]: r for r in results.rows if r.section == SECTION}
    assert math.isclose(got[13].value, 2.7) and got[13].unit == "ms" and got[13].extra["met"] == "yes"
    assert math.isclose(got[17].value, 150 / 177) and got[17].extra == {
        "issue": 17,
        "target": "≤ 0.5",
        "met": "NO",
    }


def test_a_ratio_over_a_zero_figure_is_not_a_target_row() -> None:
    results = Results()
    results.add(_row(Figure.EMBED_DYNAMIC, 10.0))
    results.add(_row(Figure.EMBED_SERIAL, 0.0))
    check_targets(results)
    assert not [r for r in results.rows if r.section == SECTION]


def test_a_figure_is_measured_once() -> None:
    results = Results()
    results.add(_row(Figure.EMBED_OURS_INT8, 1.0))
    with pytest.raises(ValueError, match="measured twice"):
        results.add(_row(Figure.EMBED_OURS_INT8, 2.0))


def test_every_target_reads_distinct_figures() -> None:
    for target in TARGETS:
        assert target.figure is not target.over, target.what
    assert len({(t.issue, t.what) for t in TARGETS}) == len(TARGETS)


def test_the_registry_names_the_stages_and_only_chooses_among_them() -> None:
    names = [s.name for s in STAGES]
    assert names[:4] == ["translation", "base", "embedding", "serving"]  # the order they run in
    assert len(set(names)) == len(names)
    assert all(s.needs <= set(Need) for s in STAGES)
    args = parse(["--data-dir", "d", "--only", "base", "serving", "--quick", "--no-infinity"])
    assert args.only == ["base", "serving"] and args.quick and args.no_infinity
    assert args.data_dir == Path("d")
    with pytest.raises(SystemExit):
        parse(["--data-dir", "d", "--only", "no-such-stage"])
