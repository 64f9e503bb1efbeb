"""Batch forming: the round-robin order over requests and the batch choice, without a loop."""

from __future__ import annotations

from typing import Any

from service.queue.forming import BatchPolicy, Pending, choose_batch, round_robin


def pending(request: int, cost: int, small: bool = False) -> Pending[str, Any]:
    return Pending(f"r{request}c{cost}", cost, 0.0, 0.0, None, request, small)  # type: ignore[arg-type]


def test_round_robin_takes_every_requests_first_item_before_any_second() -> None:
    arrivals = [(1, "a"), (1, "b"), (1, "c"), (2, "d"), (3, "e"), (2, "f")]
    order = round_robin(arrivals, lambda x: x[0])
    assert [x[1] for x in order] == ["a", "d", "e", "b", "f", "c"]
    assert [x[1] for x in round_robin(arrivals, lambda x: x[0], limit=4)] == ["a", "d", "e", "b"]


def test_a_one_item_request_is_batched_with_the_head_of_a_long_document() -> None:
    document = [pending(1, 10) for _ in range(40)]
    queue = [*document, pending(2, 30)]
    batch = choose_batch(queue, BatchPolicy(max_batch_size=4, max_batch_tokens=10_000))
    assert queue[-1] in batch and queue[0] in batch and len(batch) == 4
    assert [p.cost for p in batch] == sorted(p.cost for p in batch)


def test_a_batch_stays_within_its_padded_token_budget() -> None:
    queue = [pending(1, 10), pending(2, 100), pending(3, 12), pending(4, 11)]
    batch = choose_batch(queue, BatchPolicy(max_batch_size=8, max_batch_tokens=40))
    assert {p.request for p in batch} == {1, 3, 4}  # 100 tokens would pad the batch past 40
    assert max(p.cost for p in batch) * len(batch) <= 40
