"""Whole-batch execution: the queue's items in few large engine calls, each run to its end.

One loop per model takes a batch out of the request queue when one is due and a worker is free,
and runs it on that worker's thread, so the event loop keeps serving while the engine computes.
A batch closes when it reaches ``max_batch_size`` items, or ``max_batch_tokens`` padded tokens
(longest item × items: what a padded engine actually computes), or when its oldest item has
waited ``max_wait_s`` — a wait only worth paying while requests come together: after a batch
that carried one request alone, with nothing arriving while it ran (one client, sequential
traffic), the next request goes at once instead of waiting for company that does not come
(``RequestQueue.batch_due_in``). While every worker thread is busy, the express worker takes
the small requests' items (``express.py``).

Failure is contained: an engine result that is an exception affects only its item; an engine
call that raises fails only that batch (``EngineFailure`` in each slot) and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic

from service.metrics import BATCH_SIZE, BATCH_TOKENS, ITEM_ERRORS, labelled
from service.queue.errors import EngineFailure, QueueClosed
from service.queue.express import Worker, workers
from service.queue.forming import ItemT, Pending, ResultT
from service.queue.requests import RequestQueue

log = logging.getLogger(__name__)


class WholeBatchExecutor(Generic[ItemT, ResultT]):
    """Runs the queue's batches with ``run_batch`` (the engine call: one result or exception per
    item, in order), one batch at a time on each worker's thread.

    ``on_abandon`` tells the engine that nobody waits for a running item any more, so that it
    can stop it early (without one, running items are computed to the end)."""

    def __init__(
        self,
        run_batch: Callable[[list[ItemT]], Sequence[ResultT | Exception]],
        on_abandon: Callable[[ItemT], None] | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._on_abandon = on_abandon
        self._threads: dict[Worker, ThreadPoolExecutor] = {}
        self._busy: set[Worker] = set()
        self._running: set[asyncio.Task[None]] = set()

    async def run(self, queue: RequestQueue[ItemT, ResultT]) -> None:
        self._threads = {
            worker: ThreadPoolExecutor(1, thread_name_prefix=worker.name)
            for worker in workers("engine", queue.model, queue.policy)
        }
        while True:
            worker, batch = await self._next_batch(queue)
            self._busy.add(worker)
            task = asyncio.get_running_loop().create_task(self._execute(queue, worker, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def abandon(self, item: ItemT) -> bool:
        if self._on_abandon is None:
            return False
        self._on_abandon(item)
        return True

    async def close(self) -> None:
        for task in self._running:
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        for threads in self._threads.values():
            threads.shutdown(wait=False, cancel_futures=True)

    async def _next_batch(
        self, queue: RequestQueue[ItemT, ResultT]
    ) -> tuple[Worker, list[Pending[ItemT, ResultT]]]:
        """Wait until a batch is due and a worker thread is free (or the express worker and
        small work), then take it out of the queue."""
        while True:
            queue.purge()
            free = [worker for worker in self._threads if worker not in self._busy]
            regular = next((worker for worker in free if not worker.express), None)
            express = next((worker for worker in free if worker.express), None)
            timeout: float | None = None
            if queue.queued and regular is not None:
                timeout = queue.batch_due_in()
                if timeout <= 0:
                    return regular, queue.take_batch()
            elif queue.queued and express is not None and (small := queue.take_small()):
                return express, small
            await queue.wait(timeout)

    async def _execute(
        self, queue: RequestQueue[ItemT, ResultT], worker: Worker, batch: list[Pending[ItemT, ResultT]]
    ) -> None:
        model = queue.model
        cost = sum(p.cost for p in batch)
        try:
            labelled(BATCH_SIZE, model).observe(len(batch))
            labelled(BATCH_TOKENS, model).observe(cost)
            items = [p.item for p in batch]
            start = time.perf_counter()
            try:
                results = await asyncio.get_running_loop().run_in_executor(
                    self._threads[worker], self._call_engine, items
                )
            except asyncio.CancelledError:  # close() while running: nobody will wait for these
                for pending in batch:
                    queue.fail(pending, QueueClosed(f"{model}: shutting down"))
                raise
            except Exception as e:
                log.exception("%s: engine call failed for a batch of %d items", model, len(batch))
                failure = EngineFailure(f"{model}: engine failed on a batch: {type(e).__name__}")
                results = [failure] * len(batch)
            queue.measured(cost, time.perf_counter() - start)
            errors = sum(isinstance(r, Exception) for r in results)
            if errors:
                labelled(ITEM_ERRORS, model).inc(errors)
            queue.deliver_all(batch, results)  # to the requests still there (not cancelled, not late)
        finally:
            self._busy.discard(worker)
            queue.wake()

    def _call_engine(self, items: list[ItemT]) -> list[ResultT | Exception]:
        results = list(self._run_batch(items))
        if len(results) != len(items):
            raise RuntimeError(f"engine returned {len(results)} results for {len(items)} items")
        return results
