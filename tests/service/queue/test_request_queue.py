"""The request queue alone, driven by hand through its executor side (``take_batch``,
``deliver``, ``fail``, ``purge``, ``batch_due_in``): what every executor relies on, whatever
runs the engine — work in flight counted until answered, the abandon hand-off, the wait for
company, the retry hint and shutdown."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY

from service.queue import BatchPolicy, QueueClosed, QueueFull, RequestQueue

pytestmark = pytest.mark.anyio
_names = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class ByHand:
    """An executor whose loop does nothing: the test takes and answers the work itself."""

    stops_running: bool = True
    abandoned: list[str] = field(default_factory=list)
    closed: bool = False

    async def run(self, queue: RequestQueue[str, str]) -> None:
        await asyncio.Event().wait()  # until the queue closes

    def abandon(self, item: str) -> bool:
        self.abandoned.append(item)
        return self.stops_running

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., tuple[RequestQueue[str, str], ByHand]]]:
    made: list[RequestQueue[str, str]] = []

    def factory(executor: ByHand | None = None, **policy: float) -> tuple[RequestQueue[str, str], ByHand]:
        executor = executor or ByHand()
        options = {"max_wait_s": 10.0, **policy}
        queue: RequestQueue[str, str] = RequestQueue(
            f"test-queue-{next(_names)}",
            len,  # an item's cost: its length
            BatchPolicy(**options),  # type: ignore[arg-type]
            executor,
        )
        queue.start()
        made.append(queue)
        return queue, executor

    yield factory
    for queue in made:
        await queue.close()


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def queued(queue: RequestQueue[str, str], n: int) -> None:
    while queue.queued != n:
        await asyncio.sleep(0.001)


async def test_taken_work_is_in_flight_until_every_item_is_answered(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    queue, _ = make()
    request = asyncio.ensure_future(queue.submit(["bb", "a"], 5))
    await queued(queue, 2)
    batch = queue.take_batch()
    assert [p.item for p in batch] == ["a", "bb"]  # sorted by cost
    assert queue.queued == 0 and not queue.idle and all(p.state == "running" for p in batch)
    queue.deliver(batch[1], "BB")
    assert not queue.idle
    queue.deliver(batch[0], ValueError("a"))
    assert queue.idle
    first, second = await request
    assert first == "BB" and isinstance(second, ValueError)  # in the request's order


async def test_drain_waits_for_work_in_flight_and_refuses_new_requests(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    queue, _ = make()
    request = asyncio.ensure_future(queue.submit(["a"], 5))
    await queued(queue, 1)
    (taken,) = queue.take_batch()
    drained = asyncio.ensure_future(queue.drain(5))
    await asyncio.sleep(0.02)
    assert not drained.done()  # nothing queued, but an item still runs
    with pytest.raises(QueueClosed):
        await queue.submit(["late"], 5)
    queue.deliver(taken, "A")
    assert await drained is True and await request == ["A"]


async def test_fail_makes_the_whole_request_raise(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    queue, _ = make()
    request = asyncio.ensure_future(queue.submit(["a", "b"], 5))
    await queued(queue, 2)
    batch = queue.take_batch()
    for pending in batch:
        queue.fail(pending, QueueClosed("shutting down"))
    with pytest.raises(QueueClosed):
        await request
    assert queue.idle


async def test_a_request_raises_its_lowest_failing_item_s_error_once_every_item_is_answered(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    queue, _ = make()
    request = asyncio.ensure_future(queue.submit(["aaa", "b", "cc"], 5))
    await queued(queue, 3)
    b, cc, aaa = queue.take_batch()
    queue.fail(cc, QueueClosed("second"))
    queue.fail(b, QueueClosed("first"))
    await asyncio.sleep(0)
    assert not request.done()  # "aaa" is still running
    queue.deliver(aaa, "AAA")
    with pytest.raises(QueueClosed, match="first"):
        await request
    assert queue.idle


async def test_deliver_all_answers_a_batch_of_several_requests_and_times_each_item(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    """One call for the batch: each item to its request's slot, the requests gone skipped, each
    answered item one observation of the ``total`` stage (and each taken one of ``queue``)."""
    queue, _ = make()
    total, waited = (
        {"name": "tserve_stage_duration_seconds_count", "model": queue.model, "stage": stage}
        for stage in ("total", "queue")
    )
    first = asyncio.ensure_future(queue.submit(["bb", "a"], 5))
    gone = asyncio.ensure_future(queue.submit(["ccc"], 5))
    await queued(queue, 3)
    batch = queue.take_batch()
    assert metric(**waited) == 3
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    queue.deliver_all(batch, [p.item.upper() for p in batch])
    assert await first == ["BB", "A"] and queue.idle
    assert metric(**total) == 2  # the gone request's item was computed for nobody
    assert all(p.state == "answered" for p in batch if p.item != "ccc")


@pytest.mark.parametrize("stops_running", [True, False])
async def test_running_items_of_a_gone_request_are_handed_to_the_executor(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]], stops_running: bool
) -> None:
    """Counted as dropped only where the executor can stop them; queued ones always are."""
    queue, executor = make(ByHand(stops_running), max_batch_size=1)
    request = asyncio.ensure_future(queue.submit(["run", "queued"], 5))
    await queued(queue, 2)
    (running,) = queue.take_batch()  # the oldest, alone
    before = metric("tserve_dropped_total", model=queue.model, reason="disconnected")
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)
    assert executor.abandoned == ["run"] and queue.queued == 0
    dropped = metric("tserve_dropped_total", model=queue.model, reason="disconnected") - before
    assert dropped == (2 if stops_running else 1)
    queue.deliver(running, "RUN")  # the engine's late answer goes to nobody
    assert queue.idle


async def test_a_batch_waits_for_company_only_while_requests_come_together(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    queue, _ = make(max_wait_s=1.0, max_batch_size=3)
    first = asyncio.ensure_future(queue.submit(["a"], 5))
    await queued(queue, 1)
    assert 0.9 < queue.batch_due_in() <= 1.0  # no history yet: worth waiting for company
    (alone,) = queue.take_batch()
    queue.deliver(alone, "A")
    await first
    second = asyncio.ensure_future(queue.submit(["b"], 5))
    await queued(queue, 1)
    assert queue.batch_due_in() == 0  # the last batch held one request alone: go at once
    together = [asyncio.ensure_future(queue.submit([text], 5)) for text in "cd"]
    await queued(queue, 3)
    assert queue.batch_due_in() == 0  # a whole batch already
    batch = queue.take_batch()
    for pending in batch:
        queue.deliver(pending, pending.item.upper())
    await asyncio.gather(second, *together)
    late = asyncio.ensure_future(queue.submit(["e"], 5))
    await queued(queue, 1)
    assert queue.batch_due_in() > 0  # the last batch carried several requests: wait again
    queue.stop_accepting()
    assert queue.batch_due_in() == 0  # draining: nothing more will come
    (last,) = queue.take_batch()
    queue.deliver(last, "E")
    assert await late == ["E"]


async def test_purge_drops_queued_items_past_their_deadline(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    queue, _ = make()
    before = metric("tserve_dropped_total", model=queue.model, reason="deadline")
    request = asyncio.ensure_future(queue.submit(["a", "b"], 0.05))
    await queued(queue, 2)
    await asyncio.sleep(0.06)
    queue.purge()
    assert queue.queued == 0 and queue.idle
    assert metric("tserve_dropped_total", model=queue.model, reason="deadline") - before == 2
    assert metric("tserve_queue_depth", model=queue.model) == 0
    with pytest.raises(TimeoutError):
        await request


async def test_the_retry_hint_is_the_work_ahead_over_every_worker_thread_s_throughput(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    queue, _ = make(max_queue=2, worker_threads=2)
    queue.measured(1000, 1.0)  # 1,000 tokens/s a worker thread: 2,000 tokens/s in all
    request = asyncio.ensure_future(queue.submit(["x" * 3000, "y" * 2000], 5))
    await queued(queue, 2)
    with pytest.raises(QueueFull) as refused:
        await queue.submit(["z"], 5)
    assert refused.value.retry_after_s == 3  # 5,000 tokens queued / 2,000 per second, rounded up
    for pending in queue.take_batch():
        queue.deliver(pending, "")
    await request


async def test_close_stops_the_executor_and_fails_what_is_queued(
    make: Callable[..., tuple[RequestQueue[str, str], ByHand]],
) -> None:
    queue, executor = make()
    request = asyncio.ensure_future(queue.submit(["a"], 5))
    await queued(queue, 1)
    await queue.close()
    assert executor.closed and queue.queued == 0
    with pytest.raises(QueueClosed):
        await request
    with pytest.raises(QueueClosed):
        await queue.submit(["b"], 5)
