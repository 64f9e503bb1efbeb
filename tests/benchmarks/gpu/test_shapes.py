"""The speed stage's embedding shape rows, on the CPU provider with the tiny embedding artefact:
their rows and shape counts, the arena row's CUDA-only wrapping of ``resolve_providers`` (and
its undoing), the batches each row cuts, and the two threads of the threaded row."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu import shapes
from benchmarks.gpu.run import DEVICE_VARIANT, QUICK, GpuRun
from benchmarks.gpu.shapes import (
    CHURN,
    CHURN_ARENA,
    CHURN_THREADS,
    CHURN_UNPADDED,
    FIXED,
    REPEATING,
    RandomBatches,
    ShapeRun,
    arena_extend_strategy,
)
from service.cuda import CUDA
from service.engine import session as engine_session
from service.engine.session import CPU
from service.settings import DEFAULT_EMBED_MODEL


def a_run(tmp_path: Path, artefact: Path) -> GpuRun:
    """A quick CPU run whose default embedding model is ``artefact``, over 60 STS-dev lines of
    sentences of 1 to 14 words (the tiny model cuts at 16 tokens)."""
    root = tmp_path / "artefacts"
    (root / DEFAULT_EMBED_MODEL).mkdir(parents=True)
    (root / DEFAULT_EMBED_MODEL / DEVICE_VARIANT).symlink_to(artefact, target_is_directory=True)
    sentences = [" ".join(f"w{i}x{j}" for j in range(1 + i % 14)) for i in range(120)]
    pairs = zip(sentences[::2], sentences[1::2], strict=True)
    lines = [f"g\tMSRvid\t2012\t{k}\t1.0\t{a}\t{b}" for k, (a, b) in enumerate(pairs)]
    (tmp_path / "data" / "stsb").mkdir(parents=True)
    (tmp_path / "data" / "stsb" / "sts-dev.csv").write_text("\n".join(lines) + "\n")
    args = argparse.Namespace(quick=True)
    return GpuRun(args, "cpu", QUICK, root, tmp_path / "data", tmp_path / "out", tmp_path / "w", 1)


def test_the_rows_measure_fixed_shapes_against_churn_and_skip_the_arena_on_the_cpu(
    tmp_path: Path,
    embedding_artefact: Path,
) -> None:
    gpu = a_run(tmp_path, embedding_artefact)
    resolve = engine_session.resolve_providers
    shapes.run(gpu, 1)
    rows = {r.system: r for r in gpu.results.rows}
    assert list(rows) == [FIXED, REPEATING, CHURN, CHURN_THREADS]
    assert [r.system for r in gpu.results.rows if r.baseline] == [FIXED]
    assert all(r.value > 0 and r.unit == "sent/s" for r in rows.values())
    assert len({r.section for r in rows.values()}) == 1
    # sorted batches repeat their few shapes; random ones keep making new ones
    distinct = {name: row.extra["shapes"] for name, row in rows.items()}
    assert min(distinct[REPEATING], distinct[CHURN], distinct[CHURN_THREADS]) > distinct[FIXED]
    assert distinct[CHURN] > distinct[REPEATING]  # passes of new draws, against one plan replayed
    assert rows[FIXED].extra["rows_per_run"] > rows[CHURN].extra["rows_per_run"]
    assert "arena" not in rows[CHURN].extra  # no CUDA options on a CPU session
    assert f"{CHURN_ARENA}: not measured, arena_extend_strategy is a CUDA option" in gpu.results.notes
    assert f"{CHURN_UNPADDED}: not measured, the CPU's engines do not pad" in gpu.results.notes
    assert gpu.results.notes[-1] == shapes.READING
    assert engine_session.resolve_providers is resolve


def test_sessions_made_inside_get_the_arena_strategy_and_the_providers_are_restored_after(
    monkeypatch: pytest.MonkeyPatch,
    embedding_artefact: Path,
) -> None:
    asked: list[str] = []

    def resolve(pref: str, device_id: int = 0) -> list[Any]:
        asked.append(pref)
        if pref == "cpu":
            return [CPU]
        return [(CUDA, {"arena_extend_strategy": "kSameAsRequested", "device_id": device_id}), CPU]

    monkeypatch.setattr(engine_session, "resolve_providers", resolve)
    with arena_extend_strategy("kNextPowerOfTwo"):
        assert engine_session.resolve_providers("cuda", 1) == [
            (CUDA, {"arena_extend_strategy": "kNextPowerOfTwo", "device_id": 1}),
            CPU,
        ]
        assert engine_session.resolve_providers("cpu") == [CPU]
        shapes.service_engine(embedding_artefact, "cpu", 1)  # its session asks the wrapper
    assert asked == ["cuda", "cpu", "cpu"]
    assert engine_session.resolve_providers is resolve
    with pytest.raises(RuntimeError), arena_extend_strategy("kNextPowerOfTwo"):
        raise RuntimeError("a failing load")
    assert engine_session.resolve_providers is resolve


def test_churn_draws_new_batches_every_pass_and_repeating_the_same() -> None:
    sentences = [f"s{i}" for i in range(300)]
    churn, repeating = RandomBatches(7, 32), RandomBatches(7, 32, repeat=True)
    first, second = churn(sentences), churn(sentences)
    for batches in (first, second, repeating(sentences)):
        assert sorted(s for b in batches for s in b) == sorted(sentences)  # each sentence once
        assert all(1 <= len(b) <= 32 for b in batches)
    assert [len(b) for b in first] != [len(b) for b in second]
    assert repeating(sentences) == repeating(sentences)
    assert RandomBatches(7, 32)(sentences) == first  # seeded


class TwoThreadEngine:
    """An engine whose first call on each thread waits for a second thread to call too."""

    def __init__(self) -> None:
        self.session = object()
        self.threads: set[int] = set()
        self.items = 0
        self._barrier = threading.Barrier(2, timeout=5)

    def embed(self, items: Sequence[Any]) -> list[Any]:
        self.items += len(items)
        if threading.get_ident() not in self.threads:
            self.threads.add(threading.get_ident())
            self._barrier.wait()
        return [None] * len(items)


def test_the_threaded_row_embeds_its_shares_on_two_threads_at_once() -> None:
    engine = TwoThreadEngine()
    system = ShapeRun(CHURN_THREADS, engine, RandomBatches(7, 4), lanes=2)
    system.embed([f"s{i}" for i in range(40)])
    assert len(engine.threads) == 2 and engine.items == 40
