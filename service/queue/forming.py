"""Which queued items form the next batch: the policy, the queued item, and the choice.

No state and no asyncio here: the request queue (``requests.py``) calls these on its items and
marks what it takes, for either executor.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
X = TypeVar("X")


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    max_wait_s: float = 0.005
    max_queue: int = 1024
    worker_threads: int = 1  # engine runs in flight at once (``TSERVE_WORKER_THREADS``)
    # One more worker for small requests (of at most this many tokens), while every worker
    # thread is busy, so that a one-sentence request is not held behind a long batch
    # (``express.py``). 0: none.
    express_max_tokens: int = 0


class Answers(Generic[ResultT]):
    """One request's results, a slot per item, and the future its ``submit`` awaits: set when
    every item is answered (or by the request's deadline), cancelled when nobody waits any more.
    One future a request, not one an item: an item's answer is a slot written and a count taken
    down, with no callback scheduled on the event loop for it."""

    __slots__ = ("done", "failure", "left", "results")

    def __init__(self, n: int, done: asyncio.Future[None]) -> None:
        self.results: list[ResultT | Exception | None] = [None] * n
        self.left = n  # items not answered yet
        self.failure: tuple[int, Exception] | None = None  # the lowest-indexed item that raises
        self.done = done

    def answer(self, index: int, result: ResultT | Exception) -> None:
        """Item ``index``'s result (an exception in its slot: the item failed)."""
        self.results[index] = result
        self._count()

    def fail(self, index: int, error: Exception) -> None:
        """Item ``index`` raises ``error``: the whole request does, once every item is answered
        (the lowest-indexed such item's error)."""
        if self.failure is None or index < self.failure[0]:
            self.failure = (index, error)
        self._count()

    def _count(self) -> None:
        self.left -= 1
        if not self.left and not self.done.done():
            self.done.set_result(None)


@dataclass(eq=False, slots=True)
class Pending(Generic[ItemT, ResultT]):
    """One queued item of a request: its cost, deadline and its slot among the request's
    answers (the continuous executor hands these to its worker threads too)."""

    item: ItemT
    cost: int
    deadline: float  # loop.time()
    enqueued: float  # time.perf_counter()
    answers: Answers[ResultT]
    request: int  # which submit() it came from
    small: bool  # its whole request fits the express worker
    index: int = 0  # its slot in ``answers``
    state: Literal["queued", "running", "answered", "dropped"] = "queued"

    @property
    def waited_for(self) -> bool:
        """Its request still waits for it: not answered, not abandoned, not past its deadline."""
        return self.state != "answered" and not self.answers.done.done()


def round_robin(items: Iterable[X], request_of: Callable[[X], int], limit: int | None = None) -> list[X]:
    """``items`` (in arrival order) taken every request's first, then every request's second, …
    (requests in order of their first item), at most ``limit`` of them; so a one-item request
    waits behind one item of each document, not behind whole documents, and the oldest item
    stays first."""
    by_request: dict[int, list[X]] = {}
    for item in items:
        by_request.setdefault(request_of(item), []).append(item)
    if len(by_request) == 1:
        (only,) = by_request.values()
        return only[:limit]
    rounds = itertools.chain.from_iterable(itertools.zip_longest(*by_request.values(), fillvalue=_NONE))
    return list(itertools.islice((item for item in rounds if item is not _NONE), limit))


_NONE: Any = object()  # zip_longest's filler: no item of that request in this round


Queue = Sequence[Pending[ItemT, ResultT]]


def is_full(queue: Queue[ItemT, ResultT], policy: BatchPolicy) -> bool:
    """Whether the queued items (all ``queued``) already make a whole batch."""
    if len(queue) >= policy.max_batch_size:
        return True
    return max(p.cost for p in queue) * len(queue) >= policy.max_batch_tokens


def choose_batch(queue: Queue[ItemT, ResultT], policy: BatchPolicy) -> list[Pending[ItemT, ResultT]]:
    """The oldest item, the oldest of every other request, then the nearest in length, within
    ``max_batch_size`` items and ``max_batch_tokens`` padded tokens; sorted by cost."""
    anchor = queue[0]
    window = round_robin(queue[1:], _request, 4 * policy.max_batch_size)
    firsts: list[Pending[ItemT, ResultT]] = []
    others: list[Pending[ItemT, ResultT]] = []
    seen = {anchor.request}
    for pending in window:
        (others if pending.request in seen else firsts).append(pending)
        seen.add(pending.request)
    anchor_cost = anchor.cost
    candidates = firsts + sorted(others, key=lambda p: abs(p.cost - anchor_cost))
    batch = [anchor]
    size, budget = policy.max_batch_size, policy.max_batch_tokens
    longest = anchor_cost
    for pending in candidates:
        n = len(batch) + 1  # with this one
        if n > size or longest * n > budget:
            break  # full: no candidate fits, not even one as short as the longest taken
        wider = pending.cost if pending.cost > longest else longest
        if wider * n <= budget:
            batch.append(pending)
            longest = wider
    return sorted(batch, key=lambda p: p.cost)


def _request(pending: Pending[ItemT, ResultT]) -> int:
    return pending.request
