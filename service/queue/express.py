"""Express: one more worker per model, beside its worker threads, for small requests only.

A request is small when its items together cost at most ``BatchPolicy.express_max_tokens``
tokens (``is_small``: the queue marks each of its items ``Pending.small`` at submit). The
express worker runs only items of small requests (``Worker.takes``, ``choose_small``), and only
those the worker threads cannot start soon, so that a one-sentence request is not held behind
a long batch or a long decode, while a document's sentences, however short each one is, never
crowd it. Both executors build their workers here (``workers``): the whole-batch executor runs
whole batches on them, the continuous one a running decode on each.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from service.queue.forming import BatchPolicy, ItemT, Pending, Queue, ResultT


@dataclass(frozen=True)
class Worker:
    """One engine run in flight at a time, on its own thread (named ``name``)."""

    name: str
    express: bool = False

    def takes(self, pending: Pending[Any, Any]) -> bool:
        """Whether this worker may run the item at all: the express one only small requests'."""
        return pending.small or not self.express


def workers(kind: str, model: str, policy: BatchPolicy) -> list[Worker]:
    """``policy.worker_threads`` workers (``{kind}-{model}-0``, …), then the express one
    (``{kind}-{model}-express``) when ``policy.express_max_tokens`` is set."""
    regular = [Worker(f"{kind}-{model}-{i}") for i in range(policy.worker_threads)]
    if policy.express_max_tokens:
        return [*regular, Worker(f"{kind}-{model}-express", express=True)]
    return regular


def is_small(costs: Iterable[int], policy: BatchPolicy) -> bool:
    """Whether a request of items of these token counts may use the express worker."""
    return sum(max(1, c) for c in costs) <= policy.express_max_tokens


def choose_small(queue: Queue[ItemT, ResultT], policy: BatchPolicy) -> list[Pending[ItemT, ResultT]]:
    """The oldest queued items of small requests, within the express worker's token budget."""
    budget = policy.express_max_tokens
    batch: list[Pending[ItemT, ResultT]] = []
    for pending in queue:
        if len(batch) == policy.max_batch_size or budget < 1:
            break
        if pending.small and pending.cost <= budget:
            batch.append(pending)
            budget -= pending.cost
    return batch
