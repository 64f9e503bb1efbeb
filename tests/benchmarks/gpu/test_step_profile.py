"""The decoder-step rows of the GPU check: onnxruntime's profile of a warm decode, per graph."""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import onnxruntime as ort
import pytest

from benchmarks.gpu import step_profile
from benchmarks.gpu.run import DEVICE_VARIANT, QUICK, GpuRun
from service.engine import session as engine_session
from service.settings import DEFAULT_TRANSLATE_MODELS


def a_run(tmp_path: Path, artefact: Path) -> GpuRun:
    """A quick CPU run whose default translator is ``artefact``, over test2016 files of 12 lines."""
    root = tmp_path / "artefacts" / DEFAULT_TRANSLATE_MODELS[0]
    root.mkdir(parents=True)
    (root / DEVICE_VARIANT).symlink_to(artefact, target_is_directory=True)
    data = tmp_path / "data" / "multi30k"
    data.mkdir(parents=True)
    for lang in ("en", "de"):
        lines = [" ".join(["a", "dog", "runs"][: 1 + i % 3]) for i in range(12)]
        with gzip.open(data / f"test_2016_flickr.{lang}.gz", "wt") as f:
            f.write("\n".join(lines) + "\n")
    args = argparse.Namespace(quick=True)
    return GpuRun(
        args, "cpu", QUICK, tmp_path / "artefacts", tmp_path / "data", tmp_path / "out", tmp_path / "w", 1
    )


def test_each_graph_s_runs_of_the_second_decode_are_profiled_at_one_sentence_and_the_largest_batch(
    tmp_path: Path, translation_artefact: Path
) -> None:
    gpu = a_run(tmp_path, translation_artefact)
    classes = ort.InferenceSession, engine_session.session_options
    step_profile.run(gpu)
    assert (ort.InferenceSession, engine_session.session_options) == classes  # restored
    largest = max(gpu.sizes.batches)
    rows = {r.system: r for r in gpu.results.rows}
    assert list(rows) == [
        "decoder, 1 sentence",
        "encoder, 1 sentence",
        f"decoder, {largest} sentences",
        f"encoder, {largest} sentences",
    ]
    assert [r.system for r in gpu.results.rows if r.baseline] == ["decoder, 1 sentence"]
    assert rows["encoder, 1 sentence"].extra["runs"] == 1  # a sentence's encoder runs once
    for row in rows.values():
        assert row.value > 0 and row.unit == "ms/run" and not row.higher_is_better
        assert row.extra["nodes_per_run"] > 0 and 0 < row.extra["node_share"] <= 1
    assert rows["decoder, 1 sentence"].extra["runs"] > 1  # one run a step
    assert sum("node ms per run by op type: " in n and "MatMul" in n for n in gpu.results.notes) == 4


def test_a_profile_without_runs_is_refused() -> None:
    with pytest.raises(ValueError, match="no run"):
        step_profile.last_runs([{"name": "session_initialization", "ts": 0, "dur": 5}], 3)
