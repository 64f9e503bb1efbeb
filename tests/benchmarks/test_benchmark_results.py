"""The benchmark's figures: typed keys, the stage registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.__main__ import parse
from benchmarks.harness import Need
from benchmarks.results import Figure, Results, Row
from benchmarks.stages import STAGES


def _row(figure: Figure, value: float) -> Row:
    return Row("any title", f"system {figure}", value, "x/s", figure=figure)


def test_a_figure_is_measured_once() -> None:
    results = Results()
    results.add(_row(Figure.EMBED_OURS_INT8, 1.0))
    with pytest.raises(ValueError, match="measured twice"):
        results.add(_row(Figure.EMBED_OURS_INT8, 2.0))


def test_the_registry_names_the_stages_and_only_chooses_among_them() -> None:
    names = [s.name for s in STAGES]
    # the order they run in: detection and files on the shared service, before serving stops it
    assert names[0] == "translation"
    assert names.index("detection") < names.index("serving") and names.index("files") < names.index("serving")
    assert len(set(names)) == len(names)
    assert all(s.needs <= set(Need) for s in STAGES)
    args = parse(["--data-dir", "d", "--only", "base", "serving", "--quick", "--no-infinity"])
    assert args.only == ["base", "serving"] and args.quick and args.no_infinity
    assert args.data_dir == Path("d")
    with pytest.raises(SystemExit):
        parse(["--data-dir", "d", "--only", "no-such-stage"])
