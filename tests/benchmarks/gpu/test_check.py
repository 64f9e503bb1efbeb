"""The GPU check's own logic: its verdicts, the quality figures it computes, the test counts it
reads, the results it writes, and a run of its plumbing (setup, the second start, environment,
results) with every heavy stage skipped."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.gpu import check, goals, quality, setup
from benchmarks.gpu.run import QUICK, GpuRun, failed, markdown, write
from benchmarks.results import Row
from tests.benchmarks.gpu.test_setup import tiny_pyproject, tiny_wheelhouse


def a_run(tmp_path: Path, provider: str = "cuda") -> GpuRun:
    args = argparse.Namespace(quick=True)
    return GpuRun(args, provider, QUICK, tmp_path / "a", tmp_path / "d", tmp_path / "out", tmp_path / "w", 2)


def test_spearman_ranks_ties_by_their_mean() -> None:
    stats = pytest.importorskip("scipy.stats")
    x, y = np.array([1.0, 2, 2, 3, 5, 5, 5]), np.array([2.0, 1, 4, 3, 7, 6, 6])
    assert quality.ranks(x).tolist() == [1, 2.5, 2.5, 4, 6, 6, 6]
    assert quality.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


def test_sts_pairs_are_read_with_their_gold_scores(tmp_path: Path) -> None:
    (tmp_path / "stsb").mkdir()
    rows = ["g\tMSRvid\t2012\t0\t5.000\tA man.\tA person.", "short\tline", "g\tx\t2012\t1\t0.5\tA.\tB."]
    (tmp_path / "stsb" / "sts-dev.csv").write_text("\n".join(rows) + "\n")
    first, second, gold = quality.sts_pairs(tmp_path, None)
    assert (first, second, gold.tolist()) == (["A man.", "A."], ["A person.", "B."], [5.0, 0.5])
    assert quality.sts_pairs(tmp_path, 1)[0] == ["A man."]


def test_fp16_must_stay_within_the_tolerances_of_fp32(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    scores = {
        "fp16 on CUDA": {"en→de": 37.7, "de→en": 40.3, "sts": 86.5},
        "fp32 on CPU": {"en→de": 37.98, "de→en": 40.26, "sts": 86.72},
    }
    quality.judge(run, scores)
    assert [(v.check.split(":")[0], v.passed) for v in run.verdicts] == [
        ("BLEU en→de", True),
        ("BLEU de→en", True),
        ("STS-dev Spearman", False),  # 0.22 points below
    ]
    assert failed(run) == run.verdicts[2:]


def test_a_comparison_without_its_figures_is_not_measured_and_fails(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    quality.judge(run, {"fp32 on CPU": {"en→de": 38.0}})
    assert [v.passed for v in run.verdicts] == [None, None]
    assert len(failed(run)) == 2


def test_test_counts_read_the_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase name="test_a[cpu]"/><testcase name="test_a[cuda]"/>'
        '<testcase name="test_b[cuda]"><skipped message="no CUDA"/></testcase>'
        '<testcase name="test_c[cpu]"><failure message="x"/></testcase>'
        '<testcase name="test_d"><error message="y"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = check.test_counts(report)
    assert counts == {"passed": 2, "failed": 1, "errors": 1, "skipped": 1, "passed on CUDA": 1}
    assert check.test_counts(tmp_path / "missing.xml")["passed"] == 0


def test_results_say_what_failed_and_which_goals_were_missed(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    run.meta = {"gpu": "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB"}
    run.results.add(Row("embed, batch 128", "sentence-transformers (fp16, CUDA)", 10_000.0, "sent/s", True))
    run.results.add(Row("embed, batch 128", "ours in-process (fp16, CUDA)", 25_000.0, "sent/s"))
    run.verdict("tests/gpu", True, "12 passed")
    run.verdict("translation ≥ 40,000 tokens/s", False, "9,000 tokens/s", required=False)
    paths = write(run)
    assert sorted(p.name for p in paths.values()) == ["logs.txt", "results.json", "results.md"]
    body = json.loads(paths["results.json"].read_text())
    assert [r["ratio"] for r in body["rows"]] == [1.0, 2.5]
    assert body["verdicts"][1] == {
        "check": "translation ≥ 40,000 tokens/s",
        "passed": False,
        "detail": "9,000 tokens/s",
        "required": False,
    }
    text = markdown(run)
    assert "**PASSED**" in text and "| missed |" in text and "NVIDIA H100" in text
    run.verdict("BLEU en→de", False, "Δ -0.5")
    assert "**FAILED**: 1 required check(s) failed" in markdown(run)


def test_the_plumbing_runs_end_to_end_without_its_heavy_stages(tmp_path: Path) -> None:
    """Setup from a wheelhouse, the second start in the environment it made, the environment stage
    and the results: everything but export, tests, quality and speed."""
    wheelhouse = tiny_wheelhouse(tmp_path / "py3.12")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "benchmarks.gpu.check", "--provider", "cpu", "--quick"]
    command += ["--data-dir", str(tmp_path), "--out", str(out), "--work", str(tmp_path / "work")]
    command += ["--wheelhouse", str(wheelhouse), "--target", str(tmp_path / "site")]
    command += ["--skip", *check.STAGES]
    env = {k: v for k, v in os.environ.items() if k != check.PREPARED}
    env["PYPROJECT"] = str(tiny_pyproject(tmp_path))
    done = subprocess.run(
        command, cwd=setup.REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    body = json.loads((out / "results.json").read_text())
    assert body["meta"]["setup"][0].startswith(f"installed {tmp_path / 'site'}: tserve-probe-one 1.0")
    assert "onnxruntime" in body["meta"] and body["verdicts"] == []
    assert (tmp_path / "site" / "tserve_probe_one.py").is_file()


def test_the_translation_goals_take_the_faster_of_our_two_ways_at_the_largest_batch(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    batch = max(run.sizes.batches)
    best = {("whole", batch): 39_000.0, ("continuous", batch): 41_000.0, ("http", batch): 33_000.0}
    best |= {("whole", 1): 1e6, ("continuous", 1): 1e6, ("http", 1): 1e6}  # other batches: not read
    goals.translation_goals(run, best, ("whole", "continuous"), "http", 4.5)
    assert [(v.passed, v.required) for v in run.verdicts] == [(True, False)] * 3
    assert "41,000 tokens/s" in run.verdicts[0].detail
    assert run.verdicts[1].detail == "0.80× (33,000 against 41,000 tokens/s)"
    assert not failed(run)  # goals are reported, never required
    goals.translation_goals(run, best | {("continuous", batch): 1_000.0}, ("whole", "continuous"), None, 6.0)
    assert [v.passed for v in run.verdicts[3:]] == [False, None, False]
    assert run.verdicts[4].detail == "not measured"


def test_the_embedding_goal_is_over_http_with_the_in_process_rate_beside(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    section = "embed"
    goals.embedding_goal(run, 128, Row(section, "http", 21_000.0, "sent/s"), 35_000.0)
    goals.embedding_goal(run, 128, Row(section, "http", 10_000.0, "sent/s"), 35_000.0)
    goals.embedding_goal(run, 128, None, 35_000.0)
    assert [v.passed for v in run.verdicts] == [True, False, None]
    assert run.verdicts[1].detail == "10,000 sentences/s (35,000 in-process)"


def test_the_batching_goal_is_the_gain_over_batch_size_1_or_not_measured(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    section = "serving: embed"
    one = Row(section, "batch size 1", 100.0, "sent/s", True)
    goals.batching_goal(run, "embed", Row(section, "dynamic batching", 1_500.0, "sent/s"), one)
    goals.batching_goal(run, "embed", Row(section, "dynamic batching", 150.0, "sent/s"), one)
    goals.batching_goal(run, "embed", None, one)
    goals.batching_goal(run, "embed", Row(section, "dynamic batching", 900.0, "sent/s"), None)
    assert [v.passed for v in run.verdicts] == [True, False, None, None]
    assert run.verdicts[0].detail == "15.0× (1,500 against 100 sentences/s)"
    assert run.verdicts[2].detail == "not measured"
    assert not failed(run)  # goals are reported, never required


def test_the_cuda_probe_graph_loads_in_an_older_onnxruntime_than_its_onnx() -> None:
    """The probe's IR version stays within what the exports clamp to: the H200's onnx 1.23 writes
    a newer one by default, which its onnxruntime-gpu 1.31 refused before CUDA was even tried."""
    import onnxruntime as ort

    from export.graphs.onnx_tools import MAX_IR_VERSION

    probe = check.probe_graph()
    assert probe.ir_version <= MAX_IR_VERSION
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(3, dtype=np.float32)
    assert np.array_equal(session.run(None, {"x": x})[0], x)
