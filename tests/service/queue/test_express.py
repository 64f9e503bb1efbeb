"""The express worker, one mechanism for both executors: which requests are small, which of
their queued items it takes, and the workers each executor starts."""

from __future__ import annotations

from typing import Any

from service.queue.express import Worker, choose_small, is_small, workers
from service.queue.forming import BatchPolicy, Pending


def pending(request: int, cost: int, small: bool = False) -> Pending[str, Any]:
    return Pending(f"r{request}c{cost}", cost, 0.0, 0.0, None, request, small)  # type: ignore[arg-type]


def test_the_express_worker_takes_only_small_requests_within_its_budget() -> None:
    queue = [pending(1, 5), pending(2, 3, small=True), pending(3, 9, small=True), pending(4, 2, small=True)]
    taken = choose_small(queue, BatchPolicy(express_max_tokens=6))
    assert [p.request for p in taken] == [2, 4]


def test_without_an_express_budget_nothing_is_small_and_nothing_is_taken() -> None:
    policy = BatchPolicy(express_max_tokens=0)
    assert not is_small([1], policy)
    assert choose_small([pending(1, 1, small=True)], policy) == []


def test_a_request_is_small_by_the_tokens_of_all_its_items() -> None:
    policy = BatchPolicy(express_max_tokens=8)
    assert is_small([3, 5], policy)
    assert not is_small([3, 3, 3], policy)  # each item small, the request not
    assert not is_small([0] * 9, policy)  # an item costs at least one token


def test_the_worker_threads_and_the_express_worker() -> None:
    names = [w.name for w in workers("decode", "m", BatchPolicy(worker_threads=2, express_max_tokens=8))]
    assert names == ["decode-m-0", "decode-m-1", "decode-m-express"]
    assert [w.express for w in workers("engine", "m", BatchPolicy(worker_threads=2))] == [False, False]


def test_the_express_worker_runs_only_items_of_small_requests() -> None:
    express, worker = Worker("x", express=True), Worker("w")
    small, large = pending(1, 1, small=True), pending(2, 1)
    assert express.takes(small) and not express.takes(large)
    assert worker.takes(small) and worker.takes(large)
