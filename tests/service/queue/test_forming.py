"""Batch forming: the round-robin order over requests and the batch choice, without a loop."""

from __future__ import annotations

import random
from typing import Any

import pytest

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


def _first_written(queue: list[Pending[str, Any]], policy: BatchPolicy) -> list[Pending[str, Any]]:
    """``choose_batch`` as first written, plainly, round after round: the reference the faster
    one must match item for item (ties in cost included, which keep the round-robin order)."""
    by_request: dict[int, list[Pending[str, Any]]] = {}
    for p in queue[1:]:
        by_request.setdefault(p.request, []).append(p)
    window: list[Pending[str, Any]] = []
    for depth in range(max((len(v) for v in by_request.values()), default=0)):
        window += [v[depth] for v in by_request.values() if depth < len(v)]
    window = window[: 4 * policy.max_batch_size]
    anchor, seen = queue[0], {queue[0].request}
    firsts, others = [], []
    for p in window:
        (others if p.request in seen else firsts).append(p)
        seen.add(p.request)
    batch, longest = [anchor], anchor.cost
    for p in firsts + sorted(others, key=lambda p: abs(p.cost - anchor.cost)):
        if (
            len(batch) < policy.max_batch_size
            and max(longest, p.cost) * (len(batch) + 1) <= policy.max_batch_tokens
        ):
            batch.append(p)
            longest = max(longest, p.cost)
    return sorted(batch, key=lambda p: p.cost)


@pytest.mark.parametrize("seed", range(40))
def test_the_batch_is_the_one_the_plain_rule_chooses(seed: int) -> None:
    rng = random.Random(seed)
    requests = rng.randint(1, 6)
    queue = [
        pending(rng.randrange(requests), rng.choice([3, 5, 8, 20, 60, 128]))
        for _ in range(rng.randint(1, 600))
    ]
    size = rng.choice([1, 4, 32, 8192])
    policy = BatchPolicy(max_batch_size=size, max_batch_tokens=rng.choice([64, 512, 8192]))
    assert choose_batch(queue, policy) == _first_written(queue, policy)
