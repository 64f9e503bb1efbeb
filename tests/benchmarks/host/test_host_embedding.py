"""The host stage's embedding rows: sessions replayed with the shapes the feeds ask for (the
stage's one session patcher, ``FreeRuns``, with recorded outputs), and the measurements on the
tiny embedding artefact, in-process and over HTTP, on both code paths."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import psutil
import pytest

from benchmarks.harness import Bench
from benchmarks.host.embedding import (
    PATHS,
    http_load,
    in_process_cost,
    replayed_engine,
    replayed_service,
)
from benchmarks.host.free_runs import FreeRuns
from benchmarks.host.replay import KIND, recorded, replaying
from service.artefacts import read_manifest
from service.cuda import CUDA
from service.engine.base import Embedding, EmbedItem
from service.engine.embedder import OnnxEmbedder
from service.engine.tokenizer import DEVICE_RUN_COST_TOKENS

SENTENCES = [f"sentence number {i} is {'rather ' * (i % 7)}long" for i in range(300)]


class Dim:
    def __init__(self, name: str, shape: list[Any]) -> None:
        self.name, self.shape = name, shape


class CountingSession:
    """A graph of ids (batch, sequence) → hidden (batch, sequence, 3) and pooled (batch, 3)."""

    def __init__(self) -> None:
        self.runs = 0

    def get_inputs(self) -> list[Dim]:
        return [Dim("ids", ["batch", "sequence"])]

    def get_outputs(self) -> list[Dim]:
        return [Dim("hidden", ["batch", "sequence", 3]), Dim("pooled", ["batch", 3])]

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def io_binding(self) -> None:
        raise AssertionError("a replayed graph runs with run, not IO binding")

    def run(self, names: list[str], feeds: dict[str, np.ndarray], options: Any = None) -> list[np.ndarray]:
        self.runs += 1
        b, t = feeds["ids"].shape
        out = {
            "hidden": np.ones((b, t, 3), np.float16),
            "pooled": np.arange(b * 3, dtype=np.float32).reshape(b, 3),
        }
        return [out[n] for n in names]


def test_a_replayed_session_runs_the_graph_once_and_answers_every_shape_after() -> None:
    session = CountingSession()
    runs = FreeRuns(provider=CUDA)
    runs.patch(session, KIND, recorded(session))
    assert session.get_providers() == [CUDA, "CPUExecutionProvider"]
    first = session.run(["hidden", "pooled"], {"ids": np.zeros((2, 5), np.int64)})
    for b, t in [(7, 3), (1, 9), (2, 5)]:
        hidden, pooled = session.run(["hidden", "pooled"], {"ids": np.zeros((b, t), np.int64)})
        assert hidden.shape == (b, t, 3) and hidden.dtype == np.float16
        assert pooled.shape == (b, 3) and pooled.dtype == np.float32
    assert session.runs == 1 and runs.runs[KIND] == 4
    (again,) = session.run(["pooled"], {"ids": np.zeros((2, 5), np.int64)})  # other outputs: captured anew
    assert session.runs == 2
    np.testing.assert_array_equal(again, first[1])
    assert again is not first[1]  # a fresh array each run, as a real one returns


def test_sessions_made_in_the_block_are_replayed_in_place_and_none_after(embedding_artefact: Path) -> None:
    graph = str(embedding_artefact / read_manifest(embedding_artefact).graphs["encoder"].file)
    with replaying(CUDA) as runs:
        session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    assert type(session) is ort.InferenceSession  # onnxruntime's own: isinstance checks hold
    assert session.get_providers()[0] == CUDA
    feeds = {i.name: np.ones((2, 4), np.int64) for i in session.get_inputs()}  # ids, mask, types
    first = session.run(None, feeds)
    wider = session.run(None, {k: np.ones((5, 4), np.int64) for k in feeds})
    assert runs.runs[KIND] == 2 and [w.shape[0] for w in wider] == [5] * len(first)
    after = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    after.run(None, feeds)
    assert runs.runs[KIND] == 2 and after.get_providers()[0] == "CPUExecutionProvider"


@pytest.mark.parametrize("path", list(PATHS))
def test_the_in_process_figure_on_each_code_path(embedding_artefact: Path, path: str) -> None:
    engine = replayed_engine(embedding_artefact, PATHS[path])
    assert engine.provider == PATHS[path]
    assert (engine.sub_batches.run_cost_tokens == DEVICE_RUN_COST_TOKENS) == (path == "device")
    real = OnnxEmbedder(embedding_artefact)
    items = [EmbedItem(s, normalize=True) for s in SENTENCES[:5]]
    for replayed, computed in zip(engine.embed(items), real.embed(items), strict=True):
        assert isinstance(replayed, Embedding) and isinstance(computed, Embedding)
        assert (
            replayed.vector.shape == computed.vector.shape and replayed.vector.dtype == computed.vector.dtype
        )
    cost = in_process_cost(engine, SENTENCES, min_seconds=0.05)
    assert 0 < cost.cpu_us < 1e5 and 0 < cost.wall_us < 1e5


def test_the_http_figures_from_a_replayed_service(embedding_artefact: Path, tmp_path: Path) -> None:
    args = argparse.Namespace(quick=True, threads=1, out=tmp_path, data_dir=tmp_path, duration=1.0, rounds=1)
    service = replayed_service(Bench(args), embedding_artefact, "device")
    try:
        res, extra = http_load(f"{service.base}/v1/embeddings", service.pid, SENTENCES, 2, 4, 0.5)
    finally:
        start = time.monotonic()
        service.stop()
    assert res.requests > 0 and res.errors == 0
    assert extra["server_cpu_us_per_sentence"] > 0
    assert time.monotonic() - start < 5  # the harness's services stop without a drain delay


def test_several_serving_processes_each_replay_and_are_metered_together(
    embedding_artefact: Path, tmp_path: Path
) -> None:
    """TSERVE_WORKERS=2: each serving process replays its own sessions (every answer, whichever
    process took its connection, reports the device's provider), and the server's CPU is that
    of the whole tree, whose parent only supervises."""
    args = argparse.Namespace(quick=True, threads=2, out=tmp_path, data_dir=tmp_path, duration=1.0, rounds=1)
    service = replayed_service(Bench(args), embedding_artefact, "device", workers=2)
    try:
        serving = [c for c in psutil.Process(service.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(serving) == 2
        for _ in range(8):  # a connection each: the kernel hands them to either process
            cards = httpx.get(f"{service.base}/v1/models", headers={"Connection": "close"}).json()["data"]
            assert [card["provider"] for card in cards] == [CUDA]
        parent = psutil.Process(service.pid)
        before = sum(parent.cpu_times()[:2])
        res, extra = http_load(f"{service.base}/v1/embeddings", service.pid, SENTENCES, 8, 1, 0.5)
        parent_cpu = sum(parent.cpu_times()[:2]) - before
    finally:
        service.stop()
    assert res.requests > 0 and res.errors == 0
    parent_us_per_sentence = 1e6 * parent_cpu / res.requests  # over the whole load, warm-up included
    assert extra["server_cpu_us_per_sentence"] > 2 * parent_us_per_sentence
