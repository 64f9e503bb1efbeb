"""The serving stage's load rows keep the best of their rounds, as the in-process figures do, with
the columns observed around that round."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from benchmarks import common, serving
from benchmarks.loadgen import LoadResult
from benchmarks.results import Results


def test_a_load_row_is_the_best_of_its_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three runs of 100, 300 and 200 requests in 1 s: one row, 300 items/s, with the latencies of
    that run; a single round keeps the first."""
    runs = iter([(100, 0.05), (300, 0.01), (200, 0.02), (100, 0.05)])

    def run_load(url: str, body: Any, **kwargs: Any) -> LoadResult:
        requests, latency = next(runs)
        return LoadResult(kwargs["concurrency"], 1, requests, 0, 1.0, [latency] * requests)

    monkeypatch.setattr(common, "run_load", run_load)

    def body(i: int) -> dict[str, Any]:
        return {"texts": [str(i)]}

    results = Results()
    args: dict[str, Any] = dict(clients=4, items=1, duration_s=1.0)
    best = serving.load_row(results, "s", "ours", "http://x", body, [os.getpid()], rounds=3, **args)
    assert best is not None and best.value == 300 and best.extra["p50_ms"] == 10.0
    one = serving.load_row(results, "s", "once", "http://x", body, [os.getpid()], **args)
    assert one is not None and one.value == 100
    assert [row.system for row in results.rows] == ["ours", "once"]


def test_a_load_row_takes_the_columns_observed_around_its_best_round(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = iter([100, 300, 200])

    def run_load(url: str, body: Any, **kwargs: Any) -> LoadResult:
        requests = next(runs)
        return LoadResult(kwargs["concurrency"], 1, requests, 0, 1.0, [0.01] * requests)

    monkeypatch.setattr(common, "run_load", run_load)
    observed: list[int] = []

    @contextmanager
    def observe(round_index: int) -> Iterator[dict[str, Any]]:
        columns: dict[str, Any] = {}
        yield columns
        observed.append(round_index)
        columns["batches"] = 10 * (round_index + 1)  # filled when the round ends, as an account is

    results = Results()
    args: dict[str, Any] = dict(clients=4, items=1, duration_s=1.0, rounds=3)
    row = serving.load_row(
        results, "s", "ours", "http://x", lambda i: {}, [os.getpid()], observe=observe, **args
    )
    assert row is not None and row.value == 300 and row.extra["batches"] == 20
    assert observed == [0, 1, 2] and "p50_ms" in row.extra
