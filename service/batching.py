"""Dynamic batching: many concurrent requests in, few large engine calls out.

Requests ``submit`` items and await their results; one loop per model forms batches and runs
them on a worker thread, so the event loop keeps serving while the engine computes. A batch
closes when it reaches ``max_batch_size`` items, or ``max_batch_tokens`` padded tokens (longest
item × items: what a padded engine actually computes), or when its oldest item has waited
``max_wait_s`` — a wait only worth paying while requests come together: after a batch that
carried one request alone, with nothing arriving while it ran (one client, sequential
traffic), the next request goes at once instead of waiting for company that does not come.
The oldest item always goes first (no starvation); then the oldest item of
every other waiting request, so a one-sentence request is not held behind a long document's
sentences; the rest of the batch is filled with the queued items nearest to the oldest in
length, so short texts are not padded to long ones.

Failure is contained: an engine result that is an exception affects only its item; an engine
call that raises fails only that batch (``EngineFailure`` in each slot) and the loop goes on.
Items whose request is cancelled (client gone) or past its deadline are dropped before
inference, and the engine is told about those already running (``on_abandon``), so that it can
stop them early. ``Retry-After`` is the queued and running work over the measured throughput.
This module knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from service.batch_forming import BatchPolicy, Pending, choose_batch, choose_small, is_full
from service.metrics import (
    BATCH_SIZE,
    BATCH_TOKENS,
    DROPPED,
    ITEM_ERRORS,
    QUEUE_DEPTH,
    REJECTED,
    labelled,
    observe_stage,
)

log = logging.getLogger(__name__)

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
T = TypeVar("T")

LARGE_REQUEST_CHARS = 16_384  # text work over this many characters is done on a thread


async def off_the_loop_if_large(chars: int, work: Callable[[], T]) -> T:
    """``work()`` (tokenizing, segmenting ``chars`` characters): on a worker thread when it is
    over ``LARGE_REQUEST_CHARS``, so that one big request does not hold up the event loop; here
    otherwise, where a thread hop would cost more than the work."""
    if chars > LARGE_REQUEST_CHARS:
        return await asyncio.to_thread(work)
    return work()


class QueueFull(RuntimeError):
    """The queue cannot take the request's items; retry after ``retry_after_s`` (→ 429)."""

    def __init__(self, model: str, limit: int, retry_after_s: int) -> None:
        super().__init__(f"{model}: queue full ({limit} items); retry after {retry_after_s} s")
        self.limit = limit
        self.retry_after_s = retry_after_s


class DeadlineExceeded(TimeoutError):
    """The request's deadline passed before all its items were computed (→ 504)."""

    def __init__(self, model: str, timeout_s: float) -> None:
        super().__init__(f"{model}: no result within the request deadline of {timeout_s:g} s")
        self.timeout_s = timeout_s


class BatcherClosed(RuntimeError):
    """The batcher is draining or closed: the service is shutting down (→ 503)."""


class EngineFailure(RuntimeError):
    """The engine call for a whole batch raised; every item of that batch gets this (→ 500)."""


@dataclass
class _Stats:
    tokens_per_s: float = 0.0  # moving average of one worker's measured throughput (0: none yet)
    running: int = 0
    running_cost: int = 0  # tokens in the batches being computed
    done: asyncio.Event = field(default_factory=asyncio.Event)


class DynamicBatcher(Generic[ItemT, ResultT]):
    """One model's queue and batching loop.

    ``run_batch`` is the engine call (runs on a worker thread, returns one result or exception
    per item, in order); ``cost`` is an item's token count (the engine's ``count_tokens``).
    """

    def __init__(
        self,
        model: str,
        run_batch: Callable[[list[ItemT]], Sequence[ResultT | Exception]],
        cost: Callable[[ItemT], int],
        policy: BatchPolicy,
        on_abandon: Callable[[ItemT], None] | None = None,
    ) -> None:
        self.model = model
        self._on_abandon = on_abandon
        self.policy = policy
        self._run_batch = run_batch
        self._cost = cost
        self._queue: list[Pending[ItemT, ResultT]] = []  # FIFO, dropped items purged lazily
        self._queued = 0  # live (state "queued") items in _queue
        self._accepting = True
        self._wakeup = asyncio.Event()
        self._busy = 0  # regular workers running a batch
        self._express_busy = False
        self._stats = _Stats()
        self._executor = ThreadPoolExecutor(policy.workers, thread_name_prefix=f"engine-{model}")
        self._express = ThreadPoolExecutor(1, thread_name_prefix=f"engine-{model}-express")
        self._loop_task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._queue_depth = QUEUE_DEPTH.labels(model=model)
        self._queue_depth.set(0)
        self.submitted = 0  # requests ever submitted (each its own round-robin key)
        # Whether requests have lately come together (so a batch is worth waiting for); True
        # until a batch shows otherwise.
        self._company = True

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"batcher-{self.model}"
            )

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing being computed."""
        return not (self._queued or self._stats.running)

    def stop_accepting(self) -> None:
        """New submits raise ``BatcherClosed``; queued and running items still complete."""
        self._accepting = False
        self._wakeup.set()

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Stop accepting and wait until every queued and running item is done; False on timeout."""
        self.stop_accepting()
        try:
            async with asyncio.timeout(timeout_s):
                while self._queued or self._stats.running:
                    self._stats.done.clear()
                    await self._stats.done.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop the loop; fail whatever is still queued with ``BatcherClosed``."""
        self.stop_accepting()
        tasks = [t for t in (self._loop_task, *self._running) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pending in self._queue:
            if pending.state == "queued" and not pending.future.done():
                pending.future.set_exception(BatcherClosed(f"{self.model}: shutting down"))
        self._queue.clear()
        self._set_queued(0)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._express.shutdown(wait=False, cancel_futures=True)

    # ---- the request side ------------------------------------------------------------------

    async def submit(
        self, items: Sequence[ItemT], timeout_s: float, costs: Sequence[int] | None = None
    ) -> list[ResultT | Exception]:
        """Queue ``items`` and wait for their results, in order (an item's exception in its slot).

        ``costs``: the items' token counts when the caller has them (else ``cost`` counts them).

        Raises ``QueueFull`` (nothing queued), ``BatcherClosed``, ``DeadlineExceeded`` (items
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
        small = sum(max(1, c) for c in costs) <= self.policy.express_max_tokens
        entries: list[Pending[ItemT, ResultT]] = [
            Pending(item, max(1, cost), deadline, now, loop.create_future(), request, small)
            for item, cost in zip(items, costs, strict=True)
        ]
        if self._queued or self._stats.running:
            self._company = True  # others are in flight: a batch may fill
        self._queue.extend(entries)
        self._set_queued(self._queued + len(entries))
        self._wakeup.set()
        # One future for the whole request, set by its last item or by the deadline: cheaper
        # per request than asyncio.wait's waiter, callbacks and timeout over every item.
        finished: asyncio.Future[None] = loop.create_future()
        left = len(entries)

        def item_done(_: object) -> None:
            nonlocal left
            left -= 1
            if left == 0 and not finished.done():
                finished.set_result(None)

        for entry in entries:
            entry.future.add_done_callback(item_done)

        def expire() -> None:
            if not finished.done():
                finished.set_result(None)

        timer = loop.call_at(deadline, expire)
        try:
            await finished
        except asyncio.CancelledError:
            self._abandon(entries, "disconnected")
            raise
        finally:
            timer.cancel()
        if left:
            self._abandon(entries, "deadline")
            raise DeadlineExceeded(self.model, timeout_s)
        return [e.future.result() for e in entries]

    def _admit(self, n: int) -> None:
        if not self._accepting:
            labelled(REJECTED, self.model, "shutting_down").inc(n)
            raise BatcherClosed(f"{self.model}: shutting down")
        if self._queued + n > self.policy.max_queue:
            labelled(REJECTED, self.model, "queue_full").inc(n)
            raise QueueFull(self.model, self.policy.max_queue, self._retry_after_s())

    async def _costs(self, items: Sequence[ItemT]) -> list[int]:
        size = sum(len(text) for item in items if isinstance(text := getattr(item, "text", None), str))
        return await off_the_loop_if_large(size, lambda: [max(1, self._cost(item)) for item in items])

    def _abandon(self, entries: list[Pending[ItemT, ResultT]], reason: str) -> None:
        """Nobody waits for ``entries`` any more: queued ones are dropped, running ones told to
        stop (``on_abandon``: the engine drops them at its next step)."""
        dropped = stopped = 0
        for entry in entries:
            if entry.state == "queued":
                entry.state = "dropped"
                dropped += 1
            elif entry.state == "running" and not entry.future.done() and self._on_abandon is not None:
                self._on_abandon(entry.item)
                stopped += 1
            if not entry.future.done():
                entry.future.cancel()
        if dropped or stopped:
            labelled(DROPPED, self.model, reason).inc(dropped + stopped)
        if dropped:
            self._set_queued(self._queued - dropped)
            self._stats.done.set()

    def _retry_after_s(self) -> int:
        """The work ahead (queued and running tokens) at the measured throughput, 1–60 s."""
        rate = self._stats.tokens_per_s * self.policy.workers
        if rate <= 0:
            return 1
        ahead = self._stats.running_cost + sum(p.cost for p in self._queue if p.state == "queued")
        return min(60, max(1, math.ceil(ahead / rate)))

    def _set_queued(self, n: int) -> None:
        self._queued = n
        self._queue_depth.set(n)

    # ---- the batching loop -----------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            batch, express = await self._next_batch()
            task = asyncio.get_running_loop().create_task(self._execute(batch, express))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> tuple[list[Pending[ItemT, ResultT]], bool]:
        """Wait until a batch is due and a worker is free, then take it out of the queue
        (and whether it runs on the express worker)."""
        loop = asyncio.get_running_loop()
        while True:
            self._purge(loop.time())
            timeout: float | None = None
            if self._queue and self._busy < self.policy.workers:
                waited = time.perf_counter() - self._queue[0].enqueued
                due = waited >= self.policy.max_wait_s or not self._company
                if due or is_full(self._queue, self.policy) or not self._accepting:
                    self._busy += 1
                    return self._take_batch(), False
                timeout = self.policy.max_wait_s - waited
            elif self._queue and not self._express_busy and (small := self._take_small()):
                self._express_busy = True
                return small, True
            self._wakeup.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    def _purge(self, now: float) -> None:
        """Drop items past their deadline (their request times out on its own); forget dropped ones."""
        expired = [p for p in self._queue if p.state == "queued" and p.deadline <= now]
        for pending in expired:
            pending.state = "dropped"
        if expired:
            labelled(DROPPED, self.model, "deadline").inc(len(expired))
            self._set_queued(self._queued - len(expired))
            self._stats.done.set()
        if len(self._queue) != self._queued:
            self._queue = [p for p in self._queue if p.state == "queued"]

    def _take(self, batch: list[Pending[ItemT, ResultT]]) -> list[Pending[ItemT, ResultT]]:
        """Mark ``batch`` running and take it out of the queue."""
        for pending in batch:
            pending.state = "running"
        if batch:
            self._queue = [p for p in self._queue if p.state == "queued"]
            self._set_queued(len(self._queue))
        return batch

    def _take_batch(self) -> list[Pending[ItemT, ResultT]]:
        batch = self._take(choose_batch(self._queue, self.policy))
        self._company = bool(self._queue) or len({p.request for p in batch}) > 1
        return batch

    def _take_small(self) -> list[Pending[ItemT, ResultT]]:
        return self._take(choose_small(self._queue, self.policy))

    async def _execute(self, batch: list[Pending[ItemT, ResultT]], express: bool) -> None:
        cost = sum(p.cost for p in batch)
        self._stats.running += 1
        self._stats.running_cost += cost
        try:
            now = time.perf_counter()
            for pending in batch:
                observe_stage(self.model, "queue", now - pending.enqueued)
            labelled(BATCH_SIZE, self.model).observe(len(batch))
            labelled(BATCH_TOKENS, self.model).observe(cost)
            items = [p.item for p in batch]
            loop = asyncio.get_running_loop()
            try:
                executor = self._express if express else self._executor
                results = await loop.run_in_executor(executor, self._call_engine, items)
            except asyncio.CancelledError:  # close() while running: nobody will wait for these
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(BatcherClosed(f"{self.model}: shutting down"))
                raise
            except Exception as e:
                log.exception("%s: engine call failed for a batch of %d items", self.model, len(batch))
                failure = EngineFailure(f"{self.model}: engine failed on a batch: {type(e).__name__}")
                results = [failure] * len(batch)
            rate = cost / max(time.perf_counter() - now, 1e-6)
            stats = self._stats
            stats.tokens_per_s = rate if stats.tokens_per_s <= 0 else 0.8 * stats.tokens_per_s + 0.2 * rate
            errors = sum(isinstance(r, Exception) for r in results)
            if errors:
                labelled(ITEM_ERRORS, self.model).inc(errors)
            end = time.perf_counter()
            for pending, result in zip(batch, results, strict=True):
                if not pending.future.done():  # its request may be gone (cancelled, deadline)
                    pending.future.set_result(result)
                    observe_stage(self.model, "total", end - pending.enqueued)
        finally:
            self._stats.running -= 1
            self._stats.running_cost -= cost
            self._stats.done.set()
            if express:
                self._express_busy = False
            else:
                self._busy -= 1
            self._wakeup.set()

    def _call_engine(self, items: list[ItemT]) -> list[ResultT | Exception]:
        results = list(self._run_batch(items))
        if len(results) != len(items):
            raise RuntimeError(f"engine returned {len(results)} results for {len(items)} items")
        return results
