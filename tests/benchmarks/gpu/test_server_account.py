"""The speed stage's evidence of where a served request's time goes: the server's own account of a
load row (its Prometheus metrics before and after), the same account of an engine called
in-process, and a py-spy profile of the server while the load runs, or a note saying why not."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import server_profile
from benchmarks.common import Service, free_port
from benchmarks.gpu import speed
from benchmarks.gpu.ours import EmbedOnDevice
from benchmarks.gpu.run import QUICK, GpuRun
from benchmarks.results import Results
from benchmarks.server_account import Snapshot, account, accounted, local, of_service, scrape
from benchmarks.server_profile import PySpy, py_spy_binary, summarise, top_frames, top_stacks
from benchmarks.serving import load_row

SENTENCES = ["A man is playing a guitar.", "Two dogs run on the beach.", "A woman slices an onion."]
SPIN = """
import time

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

print("spinning", flush=True)
spin(30)
"""


@pytest.fixture(scope="module")
def service(
    translation_artefact: Path,
    embedding_artefact: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Service]:
    """``python -m service`` as the check starts it, on the tiny models, on the CPU."""
    root = tmp_path_factory.mktemp("served")
    for artefact in (translation_artefact, embedding_artefact):
        (root / artefact.parent.name).symlink_to(artefact.parent, target_is_directory=True)
    log = tmp_path_factory.mktemp("logs") / "service.log"
    served = Service(
        root, ["tiny-en-de"], "tiny-bert", variant="fp32", threads=1, log=log, ready_timeout_s=120
    )
    try:
        yield served
    finally:
        served.stop()


def a_run(tmp_path: Path) -> GpuRun:
    args = argparse.Namespace(quick=True)
    run = GpuRun(args, "cpu", QUICK, tmp_path / "a", tmp_path / "d", tmp_path / "out", tmp_path / "w", 1)
    run.work.mkdir(parents=True)
    return run


def test_a_load_row_carries_the_services_account_and_a_profile_of_its_first_round(
    service: Service, tmp_path: Path
) -> None:
    gpu = a_run(tmp_path)
    row = load_row(
        gpu.results,
        "embed",
        "dynamic batching",
        f"{service.base}/v1/embeddings",
        lambda i: {"input": [SENTENCES[i % len(SENTENCES)]]},
        [service.pid],
        clients=8,
        items=1,
        duration_s=1.0,
        rounds=2,
        observe=speed.observer(gpu, service, "embed, 8 clients"),
    )
    assert row is not None
    extra = row.extra
    # 8 clients of one sentence each: never more than 8 in a batch
    assert extra["batches"] >= 1 and 1 <= extra["items_per_batch"] <= 8
    assert extra["queue_ms_per_item"] >= 0
    for stage in ("tokenize", "encoder", "pool"):
        assert extra[f"{stage}_ms_per_batch"] > 0
    assert "decoder_ms_per_batch" not in extra  # an embedder has no decoder
    assert 0 < extra["engine_busy"] <= 2.5  # two worker threads and the express one at most
    if py_spy_binary() is None:
        assert any("not profiled: py-spy missing" in n for n in gpu.results.notes)
        return
    (profile,) = [n for n in gpu.results.notes if n.startswith("py-spy, embed, 8 clients:")]
    frames = profile.splitlines()[1:]
    assert 1 <= len(frames) <= server_profile.TOP_FRAMES and all(f.startswith("  - ") for f in frames)
    assert (gpu.out / "py-spy-embed-8-clients.txt").is_file()
    (stacks,) = [p for name, p in gpu.log_files.items() if name.startswith("py-spy-embed-8-clients.txt")]
    assert stacks.read_text().count("%") >= 1


def test_a_translation_row_is_accounted_by_its_decoding(service: Service) -> None:
    results = Results()
    row = load_row(
        results,
        "translate",
        "dynamic batching",
        f"{service.base}/v1/translate",
        lambda i: {"text": [SENTENCES[i % len(SENTENCES)]], "beam_size": 2},
        [service.pid],
        clients=4,
        items=1,
        duration_s=1.0,
        observe=of_service(service.base),
    )
    assert row is not None
    # continuous decoding (the CPU's default) counts steps; whole batches count batches
    assert row.extra.get("ms_per_step", 0) > 0 or row.extra.get("decoder_ms_per_batch", 0) > 0
    assert row.extra["tokenize_ms_per_batch"] > 0 and row.extra["engine_busy"] > 0


def test_an_engine_called_in_process_is_accounted_from_this_process(
    embedding_artefact: Path,
) -> None:
    system = EmbedOnDevice(embedding_artefact, "cpu", batch=2, name="ours")
    with accounted(local) as columns:
        system.embed(SENTENCES * 2)  # 6 sentences, 3 calls of 2
    assert columns["batches"] == 3 and "items_per_batch" not in columns  # no batcher in between
    assert columns["encoder_ms_per_batch"] > 0 and columns["engine_busy"] > 0


def test_the_account_is_per_batch_and_per_item() -> None:
    def snapshot(at: float, batches: float, items: float, encoder_s: float, queue: float) -> Snapshot:
        m = frozenset({("model", "m")})
        stage = "tserve_stage_duration_seconds"
        return Snapshot(
            {
                ("tserve_batch_size_count", m): batches,
                ("tserve_batch_size_sum", m): items,
                (f"{stage}_count", m | {("stage", "encoder")}): batches,
                (f"{stage}_sum", m | {("stage", "encoder")}): encoder_s,
                (f"{stage}_count", m | {("stage", "queue")}): items,
                (f"{stage}_sum", m | {("stage", "queue")}): queue,
            },
            at,
        )

    before, after = snapshot(10.0, 5, 20, 1.0, 2.0), snapshot(12.0, 9, 148, 2.6, 8.4)
    assert account(before, after) == {
        "batches": 4,
        "items_per_batch": 32.0,
        "encoder_ms_per_batch": 400.0,
        "queue_ms_per_item": 50.0,
        "engine_busy": 0.8,
    }
    assert account(after, after) == {}  # nothing ran


def test_a_server_without_metrics_leaves_a_reason_not_a_failure() -> None:
    with accounted(lambda: scrape(f"http://127.0.0.1:{free_port()}", timeout_s=2)) as columns:
        pass
    assert columns["server_account"].startswith("unavailable: ConnectError")


def test_py_spy_names_the_function_a_process_is_busy_in(tmp_path: Path) -> None:
    if py_spy_binary() is None:
        pytest.skip("py-spy is not installed here (the dev extra has it)")
    busy = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline().strip() == "spinning"
        with PySpy(busy.pid, 1.0, tmp_path / "raw.txt") as spy:
            time.sleep(1.0)
    finally:
        busy.kill()
        busy.wait()
    assert spy.why_not is None and spy.profile is not None and spy.profile.samples > 50
    top = top_frames(spy.profile)
    assert "% spin (<string>:" in top[0] and float(top[0].split("%")[0]) > 50
    assert len(top_stacks(spy.profile, 300)) <= 300


def test_the_raw_format_is_read_by_innermost_frame_thread_and_stack() -> None:
    raw = (
        "thread (1): MainThread;main (app.py:3);run (session.py:9) 30\n"
        "thread (2): worker_0;work (app.py:7);run (session.py:9) 50\n"
        "thread (2): worker_0;work (app.py:8) 20\n"
        "not a stack line\n"
    )
    profile = summarise(raw)
    assert profile.samples == 100
    assert top_frames(profile) == ["80.0% run (session.py:9)", "20.0% work (app.py:8)"]
    assert profile.threads == {"worker_0": 70, "MainThread": 30}


def test_without_py_spy_the_check_says_not_profiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = a_run(tmp_path)
    monkeypatch.setattr(server_profile, "py_spy_binary", lambda: None)
    with PySpy(1, 1.0, tmp_path / "raw.txt") as spy:
        pass
    gpu.record_profile("embed", spy)
    assert gpu.results.notes == [
        "embed: not profiled: py-spy missing (not on PATH nor in bin/ of a sys.path folder)"
    ]


def test_a_py_spy_that_cannot_attach_says_why(tmp_path: Path) -> None:
    if py_spy_binary() is None:
        pytest.skip("py-spy is not installed here (the dev extra has it)")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with PySpy(gone.pid, 1.0, tmp_path / "raw.txt") as spy:
        pass
    assert spy.profile is None and spy.why_not is not None and spy.why_not.startswith("py-spy failed (exit ")


def test_py_spy_is_found_in_bin_of_a_path_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``pip install --target`` puts it: the wheelhouse's site folder is on PYTHONPATH."""
    site = tmp_path / "site"
    (site / "bin").mkdir(parents=True)
    binary = site / "bin" / "py-spy"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert py_spy_binary((str(tmp_path / "elsewhere"), str(site))) == binary
    assert py_spy_binary((str(tmp_path / "elsewhere"),)) is None
