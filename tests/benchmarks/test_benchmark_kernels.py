"""Issue 12's bound: our graphs' runs alone against CTranslate2's whole decode (benchmarks/kernels.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from benchmarks.kernels import OURS_GRAPHS_ALONE, TimedSession, kernel_bound
from benchmarks.results import Figure, Results
from benchmarks.targets import FLOORS, TARGETS
from benchmarks.translators import Workload
from tests.benchmarks.test_benchmark_translation import WordCodec


class Graph:
    """A session whose run takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, *args: Any) -> str:
        time.sleep(self.seconds)
        return "out"

    def get_inputs(self) -> list[str]:
        return ["input_ids"]


class Engine:
    """Translates by echoing: one graph run a call, then ``python_s`` of its own work."""

    server_pids: Sequence[int] = ()

    def __init__(self, name: str, graph: Any, python_s: float) -> None:
        self.name, self.graph, self.python_s = name, graph, python_s

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        self.graph.run()
        time.sleep(self.python_s)
        return list(texts), 10 * len(texts)


def test_a_timed_session_adds_up_its_runs_and_is_the_session_otherwise() -> None:
    timed = TimedSession(Graph(0.01))
    assert timed.run() == "out"
    assert timed.run() == "out"
    assert 0.02 <= timed.seconds < 0.2
    assert timed.get_inputs() == ["input_ids"]


def test_the_graphs_alone_row_is_what_ours_would_do_without_its_python() -> None:
    results = Results()
    # Sleeps of 0.1 s: long enough that a busy machine's late wake-ups stay within the tolerances
    graph = TimedSession(Graph(0.1))
    ours = Engine("ours", graph, 0.05)  # two thirds of each call in the graph
    ct2 = Engine("ct2", Graph(0.125), 0.0)
    texts = ["a b", "c", "d e f", "g"]
    figures = (
        Figure.KERNELS_BATCH32_CT2_INT8,
        Figure.KERNELS_BATCH32_OURS_WHOLE,
        Figure.KERNELS_BATCH32_OURS_GRAPHS,
    )
    workloads = [(Workload(4, 2, 0, False), texts, *figures)]
    kernel_bound(results, "t", ct2, ours, [graph], workloads, WordCodec(), rounds=2)  # type: ignore[arg-type]

    rows = {r.system: r for r in results.rows}
    assert rows["ct2"].baseline and rows["ct2"].figure is Figure.KERNELS_BATCH32_CT2_INT8
    assert rows["ours"].figure is Figure.KERNELS_BATCH32_OURS_WHOLE
    assert rows[OURS_GRAPHS_ALONE].figure is Figure.KERNELS_BATCH32_OURS_GRAPHS
    assert rows[OURS_GRAPHS_ALONE].extra["share_of_ours"] == pytest.approx(2 / 3, abs=0.12)
    # graphs alone: the calls' graph time only (2 calls of 0.1 s for 40 tokens), CTranslate2 0.125 s a call
    assert rows[OURS_GRAPHS_ALONE].value == pytest.approx(40 / 0.2, rel=0.25)
    assert rows[OURS_GRAPHS_ALONE].ratio == pytest.approx(0.125 / 0.1, rel=0.25)
    assert rows["ours"].value < rows[OURS_GRAPHS_ALONE].value
    bound = next(f for f in FLOORS if f.of.figure is Figure.KERNELS_BATCH32_OURS_GRAPHS)
    assert bound.value(results) == pytest.approx(rows[OURS_GRAPHS_ALONE].ratio)
    share = next(t for t in TARGETS if t.of.figure is Figure.KERNELS_BATCH32_OURS_WHOLE)
    assert share.value(results) == pytest.approx(rows[OURS_GRAPHS_ALONE].extra["share_of_ours"], abs=0.01)
