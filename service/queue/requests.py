"""One model's request queue: many concurrent requests in, their items out to an executor.

Requests ``submit`` items and await their results. The queue admits a request's items all at
once or not at all: over ``max_queue`` items it refuses with ``QueueFull`` (its ``Retry-After``
is the queued and running work over the measured throughput), and while draining with
``QueueClosed``. Items whose request is cancelled (client gone) or past its deadline are
dropped before they run, and the executor is told about those already running (``abandon``),
so that the engine can stop them early.

How the items run is the executor's, given at construction and started with the queue: the
whole-batch one (``whole_batch.py``) or the continuous one (``continuous.py``). It takes work
out (``take_batch``: the fair, length-grouped choice of ``forming.py``; ``take_small`` for the
express worker: ``express.py``) and answers each item (``deliver`` / ``fail``); the queue
counts that work in flight for ``idle``, ``drain`` and the retry hint. Knows nothing of
threads, of the engine or of HTTP.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from service.metrics import DROPPED, QUEUE_DEPTH, REJECTED, labelled, observe_stages
from service.queue.errors import DeadlineExceeded, QueueClosed, QueueFull
from service.queue.express import choose_small, is_small
from service.queue.forming import Answers, BatchPolicy, ItemT, Pending, ResultT, choose_batch, is_full

T = TypeVar("T")

LARGE_REQUEST_CHARS = 16_384  # text work over this many characters is done on a thread


async def off_the_loop_if_large(chars: int, work: Callable[[], T]) -> T:
    """``work()`` (tokenizing, segmenting ``chars`` characters): on a worker thread when it is
    over ``LARGE_REQUEST_CHARS``, so that one big request does not hold up the event loop; here
    otherwise, where a thread hop would cost more than the work."""
    if chars > LARGE_REQUEST_CHARS:
        return await asyncio.to_thread(work)
    return work()


class Executor(Protocol[ItemT, ResultT]):
    """Runs what a ``RequestQueue`` hands out, on threads of its own."""

    async def run(self, queue: RequestQueue[ItemT, ResultT]) -> None:
        """Take work out of ``queue`` and answer it, until cancelled."""

    def abandon(self, item: ItemT) -> bool:
        """Nobody waits for this running item any more: tell the engine (whether it can)."""

    async def close(self) -> None:
        """Stop the threads; what they still hold fails with ``QueueClosed``."""


@dataclass
class _InFlight:
    items: int = 0  # taken out of the queue, not answered yet
    cost: int = 0  # their tokens
    tokens_per_s: float = 0.0  # moving average of one worker's measured throughput (0: none yet)
    done: asyncio.Event = field(default_factory=asyncio.Event)  # an item left the queue or finished


class RequestQueue(Generic[ItemT, ResultT]):
    """One model's queue, run by ``executor``; ``cost`` is an item's token count (the engine's
    ``count_tokens``)."""

    def __init__(
        self,
        model: str,
        cost: Callable[[ItemT], int],
        policy: BatchPolicy,
        executor: Executor[ItemT, ResultT],
    ) -> None:
        self.model = model
        self.policy = policy
        self._cost = cost
        self._executor = executor
        self._items: list[Pending[ItemT, ResultT]] = []  # FIFO, dropped items purged lazily
        self._queued = 0  # live (state "queued") items in _items
        self._accepting = True
        self._wakeup = asyncio.Event()
        self._in_flight = _InFlight()
        self._serving: asyncio.Task[None] | None = None
        self._queue_depth = QUEUE_DEPTH.labels(model=model)
        self._queue_depth.set(0)
        self.submitted = 0  # requests ever submitted (each its own round-robin key)
        # Whether requests have lately come together (so a batch is worth waiting for); True
        # until a batch shows otherwise.
        self._company = True

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._serving is None:
            self._serving = asyncio.get_running_loop().create_task(
                self._executor.run(self), name=f"queue-{self.model}"
            )

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing being computed."""
        return not (self._queued or self._in_flight.items)

    def stop_accepting(self) -> None:
        """New submits raise ``QueueClosed``; queued and running items still complete."""
        self._accepting = False
        self._wakeup.set()

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Stop accepting and wait until every queued and running item is done; False on timeout."""
        self.stop_accepting()
        try:
            async with asyncio.timeout(timeout_s):
                while self._queued or self._in_flight.items:
                    self._in_flight.done.clear()
                    await self._in_flight.done.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop the executor; fail whatever is still queued with ``QueueClosed``."""
        self.stop_accepting()
        if self._serving is not None:
            self._serving.cancel()
            await asyncio.gather(self._serving, return_exceptions=True)
        await self._executor.close()
        for pending in self._items:
            if pending.state == "queued" and pending.waited_for:
                pending.state = "answered"
                pending.answers.fail(pending.index, QueueClosed(f"{self.model}: shutting down"))
        self._items.clear()
        self._set_queued(0)

    # ---- the request side ------------------------------------------------------------------

    async def submit(
        self, items: Sequence[ItemT], timeout_s: float, costs: Sequence[int] | None = None
    ) -> list[ResultT | Exception]:
        """Queue ``items`` and wait for their results, in order (an item's exception in its slot).

        ``costs``: the items' token counts when the caller has them (else ``cost`` counts them).

        Raises ``QueueFull`` (nothing queued), ``QueueClosed``, ``DeadlineExceeded`` (items
        still queued are dropped). If the awaiting task is cancelled (client disconnected),
        the request's queued items are dropped before inference and counted.
        """
        if not items:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._admit(len(items))
        if costs is None:
            costs = await self._costs(items)
            self._admit(len(items))  # again: the queue may have filled while a thread counted tokens
        now = time.perf_counter()
        request = self.submitted
        self.submitted += 1
        small = is_small(costs, self.policy)
        # One future for the whole request, set by its last item or by the deadline: cheaper
        # than a future (and its callback) an item, or asyncio.wait's over every item.
        answers: Answers[ResultT] = Answers(len(items), loop.create_future())
        entries: list[Pending[ItemT, ResultT]] = [
            Pending(item, max(1, cost), deadline, now, answers, request, small, i)
            for i, (item, cost) in enumerate(zip(items, costs, strict=True))
        ]
        if not self.idle:
            self._company = True  # others are in flight: a batch may fill
        self._items.extend(entries)
        self._set_queued(self._queued + len(entries))
        self._wakeup.set()

        def expire() -> None:
            if not answers.done.done():
                answers.done.set_result(None)

        timer = loop.call_at(deadline, expire)
        try:
            await answers.done
        except asyncio.CancelledError:
            self._abandon(entries, "disconnected")
            raise
        finally:
            timer.cancel()
        if answers.left:
            self._abandon(entries, "deadline")
            raise DeadlineExceeded(self.model, timeout_s)
        if answers.failure is not None:
            raise answers.failure[1]
        return answers.results  # type: ignore[return-value]  # every slot answered

    def _admit(self, n: int) -> None:
        if not self._accepting:
            labelled(REJECTED, self.model, "shutting_down").inc(n)
            raise QueueClosed(f"{self.model}: shutting down")
        if self._queued + n > self.policy.max_queue:
            labelled(REJECTED, self.model, "queue_full").inc(n)
            raise QueueFull(self.model, self.policy.max_queue, self._retry_after_s())

    async def _costs(self, items: Sequence[ItemT]) -> list[int]:
        size = sum(len(text) for item in items if isinstance(text := getattr(item, "text", None), str))
        return await off_the_loop_if_large(size, lambda: [max(1, self._cost(item)) for item in items])

    def _abandon(self, entries: list[Pending[ItemT, ResultT]], reason: str) -> None:
        """Nobody waits for ``entries`` any more: queued ones are dropped, running ones handed
        to the executor to stop (the engine drops them at its next step)."""
        dropped = stopped = 0
        for entry in entries:
            if entry.state == "queued":
                entry.state = "dropped"
                dropped += 1
            elif entry.state == "running":
                stopped += self._executor.abandon(entry.item)
        if entries:
            entries[0].answers.done.cancel()  # a no-op once set (by the deadline)
        if dropped or stopped:
            labelled(DROPPED, self.model, reason).inc(dropped + stopped)
        if dropped:
            self._set_queued(self._queued - dropped)
            self._in_flight.done.set()

    def _retry_after_s(self) -> int:
        """The work ahead (queued and running tokens) at the measured throughput, 1–60 s."""
        rate = self._in_flight.tokens_per_s * self.policy.worker_threads
        if rate <= 0:
            return 1
        ahead = self._in_flight.cost + sum(p.cost for p in self._items if p.state == "queued")
        return min(60, max(1, math.ceil(ahead / rate)))

    def _set_queued(self, n: int) -> None:
        self._queued = n
        self._queue_depth.set(n)

    # ---- the executor side -----------------------------------------------------------------

    async def wait(self, timeout_s: float | None = None) -> None:
        """Until something changed (a submit, a drop, ``wake``) or ``timeout_s`` passed."""
        self._wakeup.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self._wakeup.wait()
        except TimeoutError:
            pass

    def wake(self) -> None:
        """The executor can take more: its ``wait`` returns."""
        self._wakeup.set()

    def purge(self) -> None:
        """Drop items past their deadline (their request times out on its own); forget dropped ones."""
        now = asyncio.get_running_loop().time()
        expired = [p for p in self._items if p.state == "queued" and p.deadline <= now]
        for pending in expired:
            pending.state = "dropped"
        if expired:
            labelled(DROPPED, self.model, "deadline").inc(len(expired))
            self._set_queued(self._queued - len(expired))
            self._in_flight.done.set()
        if len(self._items) != self._queued:
            self._items = [p for p in self._items if p.state == "queued"]

    def batch_due_in(self) -> float:
        """Seconds until the queued items' batch is due (≤ 0: now). It waits up to ``max_wait_s``
        for company only while requests come together, the queue does not make a whole batch
        already and is not draining. Call after ``purge``, with items queued."""
        waited = time.perf_counter() - self._items[0].enqueued
        if not self._company or is_full(self._items, self.policy) or not self._accepting:
            return 0.0
        return self.policy.max_wait_s - waited

    def take_batch(self) -> list[Pending[ItemT, ResultT]]:
        """The next batch (``choose_batch``), out of the queue and in flight."""
        batch = self._take(choose_batch(self._items, self.policy))
        self._company = bool(self._items) or len({p.request for p in batch}) > 1
        return batch

    def take_small(self) -> list[Pending[ItemT, ResultT]]:
        """Work for the express worker (``choose_small``; none without one), out of the queue."""
        return self._take(choose_small(self._items, self.policy))

    def _take(self, batch: list[Pending[ItemT, ResultT]]) -> list[Pending[ItemT, ResultT]]:
        if not batch:
            return batch
        now = time.perf_counter()
        for pending in batch:
            pending.state = "running"
        observe_stages(self.model, "queue", [now - pending.enqueued for pending in batch])
        self._items = [p for p in self._items if p.state == "queued"]
        self._set_queued(len(self._items))
        self._in_flight.items += len(batch)
        self._in_flight.cost += sum(p.cost for p in batch)
        return batch

    def deliver(self, pending: Pending[ItemT, ResultT], result: ResultT | Exception) -> None:
        """An item's result (an exception in its slot) to its request, if that still waits."""
        self.deliver_all((pending,), (result,))  # the continuous executor's: item by item

    def deliver_all(
        self, batch: Sequence[Pending[ItemT, ResultT]], results: Sequence[ResultT | Exception]
    ) -> None:
        """Each item of ``batch`` its result (an exception in its slot), to its request if that
        still waits, all at one time: their total stage observed at once."""
        now = time.perf_counter()
        totals: list[float] = []
        for pending, result in zip(batch, results, strict=True):
            if pending.waited_for:
                pending.state = "answered"
                pending.answers.answer(pending.index, result)
                totals.append(now - pending.enqueued)
        observe_stages(self.model, "total", totals)
        self._answered(len(batch), sum(p.cost for p in batch))

    def fail(self, pending: Pending[ItemT, ResultT], error: Exception) -> None:
        """Its whole request raises ``error`` (the service is shutting down under it)."""
        if pending.waited_for:
            pending.state = "answered"
            pending.answers.fail(pending.index, error)
        self._answered(1, pending.cost)

    def _answered(self, items: int, cost: int) -> None:
        self._in_flight.items -= items
        self._in_flight.cost -= cost
        self._in_flight.done.set()

    def measured(self, tokens: int, seconds: float) -> None:
        """A worker computed ``tokens`` in ``seconds``: the throughput behind the retry hint."""
        rate = tokens / max(seconds, 1e-6)
        previous = self._in_flight.tokens_per_s
        self._in_flight.tokens_per_s = rate if previous <= 0 else 0.8 * previous + 0.2 * rate
