"""The request queue with the whole-batch executor: batch formation (size, tokens, wait, length
grouping), isolation, cancellation, deadlines, back-pressure, the express worker and shutdown."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from prometheus_client import REGISTRY

from service.engine.base import Embedding, EmbedItem, TextTooLong
from service.queue import (
    BatchPolicy,
    DeadlineExceeded,
    EngineFailure,
    QueueClosed,
    QueueFull,
    RequestQueue,
    WholeBatchExecutor,
)
from tests.service.small_engines import HashEmbedder

pytestmark = pytest.mark.anyio
_names = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(frozen=True)
class Item:
    text: str
    cost: int = 1


class Recorder:
    """An engine function: records each batch, optionally held by a gate, echoes texts."""

    def __init__(self, gate: threading.Event | None = None, fail: str = "", crash: str = "") -> None:
        self.batches: list[list[str]] = []
        self.gate = gate
        self.fail = fail
        self.crash = crash

    def __call__(self, items: list[Item]) -> list[str | Exception]:
        self.batches.append([it.text for it in items])
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.crash and any(it.text == self.crash for it in items):
            raise RuntimeError("the whole call failed")
        return [ValueError(it.text) if it.text == self.fail else it.text.upper() for it in items]


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.005)


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., RequestQueue[Item, str]]]:
    made: list[RequestQueue[Item, str]] = []

    def factory(engine: Recorder, **policy: float) -> RequestQueue[Item, str]:
        options = {"max_wait_s": 0.001, **policy}
        queue: RequestQueue[Item, str] = RequestQueue(
            f"test-queue-{next(_names)}",
            lambda item: item.cost,
            BatchPolicy(**options),  # type: ignore[arg-type]
            WholeBatchExecutor(engine),
        )
        queue.start()
        made.append(queue)
        return queue

    yield factory
    for queue in made:
        await queue.close()


async def test_results_come_back_in_order(make: Callable[..., RequestQueue[Item, str]]) -> None:
    queue = make(Recorder())
    assert await queue.submit([Item("a"), Item("b", 5), Item("c")], 5) == ["A", "B", "C"]


async def test_batches_close_at_max_batch_size(make: Callable[..., RequestQueue[Item, str]]) -> None:
    engine = Recorder()
    queue = make(engine, max_batch_size=4, max_wait_s=10)  # only size can close a batch quickly
    results = await asyncio.wait_for(asyncio.gather(*(queue.submit([Item(str(i))], 20) for i in range(8))), 5)
    assert [r[0] for r in results] == [str(i) for i in range(8)]
    assert sorted(len(b) for b in engine.batches) == [4, 4]


async def test_batches_close_at_max_batch_tokens(make: Callable[..., RequestQueue[Item, str]]) -> None:
    engine = Recorder()
    queue = make(engine, max_batch_size=100, max_batch_tokens=10, max_wait_s=10)
    await asyncio.wait_for(asyncio.gather(*(queue.submit([Item(str(i), 5)], 20) for i in range(6))), 5)
    assert [len(b) for b in engine.batches] == [2, 2, 2]  # padded tokens: 5 × 2 = 10


async def test_a_lone_item_waits_at_most_max_wait(make: Callable[..., RequestQueue[Item, str]]) -> None:
    engine = Recorder()
    queue = make(engine, max_batch_size=100, max_wait_s=0.05)
    start = time.perf_counter()
    await asyncio.gather(queue.submit([Item("a")], 5), queue.submit([Item("b")], 5))
    elapsed = time.perf_counter() - start
    assert engine.batches == [["a", "b"]]  # waited for company, then went together
    assert 0.04 <= elapsed < 2


async def test_sequential_traffic_stops_waiting_for_company_until_requests_overlap(
    make: Callable[..., RequestQueue[Item, str]],
) -> None:
    engine = Recorder()
    queue = make(engine, max_batch_size=100, max_wait_s=0.3)
    start = time.perf_counter()
    await queue.submit([Item("first")], 5)
    assert time.perf_counter() - start >= 0.25  # no history yet: it waited for company
    start = time.perf_counter()
    await queue.submit([Item("second")], 5)  # the last batch held one request alone
    assert time.perf_counter() - start < 0.2
    start = time.perf_counter()
    await asyncio.gather(queue.submit([Item("a")], 5), queue.submit([Item("b")], 5))
    assert time.perf_counter() - start >= 0.25  # two in flight at once: waiting pays again
    assert engine.batches == [["first"], ["second"], ["a", "b"]]


async def test_an_item_over_the_token_budget_runs_alone(
    make: Callable[..., RequestQueue[Item, str]],
) -> None:
    engine = Recorder()
    queue = make(engine, max_batch_tokens=10)
    assert await queue.submit([Item("big", 50), Item("small", 1)], 5) == ["BIG", "SMALL"]
    assert sorted(engine.batches) == [["big"], ["small"]]


async def test_queued_items_are_grouped_by_length_and_sorted(
    make: Callable[..., RequestQueue[Item, str]],
) -> None:
    gate = threading.Event()
    engine = Recorder(gate)
    queue = make(engine, max_batch_size=3)
    blocker = asyncio.ensure_future(queue.submit([Item("blocker")], 10))
    await wait_for(lambda: len(engine.batches) == 1)  # the worker is busy; the rest queue up
    costs = [1, 10, 2, 11, 3, 12]
    waiting = asyncio.ensure_future(queue.submit([Item(f"c{c}", c) for c in reversed(costs)], 10))
    await wait_for(lambda: queue.queued == 6)
    gate.set()
    await asyncio.gather(blocker, waiting)
    # The oldest (c12) anchors the first batch with its nearest lengths; each batch sorted by length.
    assert engine.batches[1:] == [["c10", "c11", "c12"], ["c1", "c2", "c3"]]


async def test_a_failing_item_fails_alone(make: Callable[..., RequestQueue[Item, str]]) -> None:
    engine = Recorder(fail="bad")
    queue = make(engine, max_wait_s=0.05)
    first, second = await asyncio.gather(
        queue.submit([Item("ok"), Item("bad")], 5), queue.submit([Item("fine")], 5)
    )
    assert len(engine.batches) == 1  # all three shared one engine call
    assert first[0] == "OK" and isinstance(first[1], ValueError)
    assert second == ["FINE"]


async def test_an_engine_crash_fails_only_its_batch(make: Callable[..., RequestQueue[Item, str]]) -> None:
    engine = Recorder(crash="boom")
    queue = make(engine, max_wait_s=0.05)
    errors_before = metric("tserve_item_errors_total", model=queue.model)
    crashed, neighbour = await asyncio.gather(queue.submit([Item("boom")], 5), queue.submit([Item("x")], 5))
    assert isinstance(crashed[0], EngineFailure) and isinstance(neighbour[0], EngineFailure)
    assert metric("tserve_item_errors_total", model=queue.model) - errors_before == 2
    assert await queue.submit([Item("after")], 5) == ["AFTER"]  # the loop goes on


async def test_a_cancelled_request_is_dropped_before_inference(
    make: Callable[..., RequestQueue[Item, str]],
) -> None:
    gate = threading.Event()
    engine = Recorder(gate)
    queue = make(engine)
    blocker = asyncio.ensure_future(queue.submit([Item("blocker")], 10))
    await wait_for(lambda: len(engine.batches) == 1)
    before = metric("tserve_dropped_total", model=queue.model, reason="disconnected")
    gone = asyncio.ensure_future(queue.submit([Item("gone1"), Item("gone2")], 10))
    await wait_for(lambda: queue.queued == 2)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert queue.queued == 0
    assert metric("tserve_dropped_total", model=queue.model, reason="disconnected") - before == 2
    assert metric("tserve_queue_depth", model=queue.model) == 0
    gate.set()
    await blocker
    assert await queue.submit([Item("next")], 5) == ["NEXT"]
    assert all("gone1" not in b and "gone2" not in b for b in engine.batches)


async def test_items_past_their_deadline_are_dropped(make: Callable[..., RequestQueue[Item, str]]) -> None:
    gate = threading.Event()
    engine = Recorder(gate)
    queue = make(engine)
    blocker = asyncio.ensure_future(queue.submit([Item("blocker")], 10))
    await wait_for(lambda: len(engine.batches) == 1)
    before = metric("tserve_dropped_total", model=queue.model, reason="deadline")
    with pytest.raises(DeadlineExceeded):
        await queue.submit([Item("late")], 0.05)
    assert metric("tserve_dropped_total", model=queue.model, reason="deadline") - before == 1
    gate.set()
    await blocker
    assert engine.batches == [["blocker"]]


async def test_a_full_queue_refuses_with_a_retry_hint(make: Callable[..., RequestQueue[Item, str]]) -> None:
    gate = threading.Event()
    engine = Recorder(gate)
    queue = make(engine, max_queue=2)
    blocker = asyncio.ensure_future(queue.submit([Item("blocker")], 10))
    await wait_for(lambda: len(engine.batches) == 1)
    queued = asyncio.ensure_future(queue.submit([Item("q1"), Item("q2")], 10))
    await wait_for(lambda: queue.queued == 2)
    before = metric("tserve_rejected_total", model=queue.model, reason="queue_full")
    with pytest.raises(QueueFull) as refused:
        await queue.submit([Item("one too many")], 10)
    assert refused.value.retry_after_s >= 1 and refused.value.limit == 2
    assert metric("tserve_rejected_total", model=queue.model, reason="queue_full") - before == 1
    gate.set()
    assert await queued == ["Q1", "Q2"]
    await blocker


async def test_drain_finishes_queued_work_then_refuses(
    make: Callable[..., RequestQueue[Item, str]],
) -> None:
    gate = threading.Event()
    engine = Recorder(gate)
    queue = make(engine, max_wait_s=10)  # without draining these would wait for company
    pending = asyncio.ensure_future(queue.submit([Item("a"), Item("b")], 10))
    await wait_for(lambda: len(engine.batches) == 1 or queue.queued == 2)
    drained = asyncio.ensure_future(queue.drain(5))
    await asyncio.sleep(0.02)
    assert not drained.done()
    with pytest.raises(QueueClosed):
        await queue.submit([Item("late")], 5)
    gate.set()
    assert await drained is True
    assert await pending == ["A", "B"]


async def test_close_fails_what_is_still_queued(make: Callable[..., RequestQueue[Item, str]]) -> None:
    gate = threading.Event()
    engine = Recorder(gate)
    queue = make(engine)
    blocker = asyncio.ensure_future(queue.submit([Item("blocker")], 10))
    await wait_for(lambda: len(engine.batches) == 1)
    waiting = asyncio.ensure_future(queue.submit([Item("w")], 10))
    await wait_for(lambda: queue.queued == 1)
    await queue.close()
    gate.set()
    for task in (blocker, waiting):
        with pytest.raises(QueueClosed):
            await task


async def test_a_real_engine_behind_the_queue() -> None:
    """The small embedder through the queue: isolation of TextTooLong, metrics per batch."""
    engine = HashEmbedder(name=f"test-queue-{next(_names)}", max_len=4)
    queue: RequestQueue[EmbedItem, Embedding] = RequestQueue(
        engine.manifest.name,
        lambda it: engine.count_tokens(it.text),
        BatchPolicy(max_wait_s=0.001),
        WholeBatchExecutor(engine.embed),
    )
    queue.start()
    try:
        batches_before = metric("tserve_batch_size_count", model=engine.manifest.name)
        results = await queue.submit([EmbedItem("a b"), EmbedItem("a b c d e", truncate=False)], 5)
        assert isinstance(results[0], Embedding) and results[0].n_tokens == 4
        assert isinstance(results[1], TextTooLong)
        assert metric("tserve_batch_size_count", model=engine.manifest.name) - batches_before == 1
        assert metric("tserve_stage_duration_seconds_count", model=engine.manifest.name, stage="queue") >= 2
    finally:
        await queue.close()


@pytest.fixture
async def with_abandon() -> AsyncIterator[
    tuple[RequestQueue[Item, str], Recorder, list[Item], threading.Event]
]:
    gate = threading.Event()
    engine = Recorder(gate)
    told: list[Item] = []
    queue: RequestQueue[Item, str] = RequestQueue(
        f"test-queue-{next(_names)}",
        lambda item: item.cost,
        BatchPolicy(max_wait_s=0.001),
        WholeBatchExecutor(engine, told.append),
    )
    queue.start()
    yield queue, engine, told, gate
    gate.set()
    await queue.close()


async def test_running_items_whose_deadline_passes_are_handed_to_on_abandon(
    with_abandon: tuple[RequestQueue[Item, str], Recorder, list[Item], threading.Event],
) -> None:
    queue, engine, told, _ = with_abandon
    before = metric("tserve_dropped_total", model=queue.model, reason="deadline")
    with pytest.raises(DeadlineExceeded):
        await queue.submit([Item("slow"), Item("slower")], 0.1)
    assert engine.batches == [["slow", "slower"]]  # they were running, not queued
    assert told == [Item("slow"), Item("slower")]
    assert metric("tserve_dropped_total", model=queue.model, reason="deadline") - before == 2


async def test_running_items_of_a_cancelled_request_are_handed_to_on_abandon(
    with_abandon: tuple[RequestQueue[Item, str], Recorder, list[Item], threading.Event],
) -> None:
    queue, engine, told, _ = with_abandon
    task = asyncio.ensure_future(queue.submit([Item("gone")], 10))
    await wait_for(lambda: len(engine.batches) == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert told == [Item("gone")]


async def test_retry_after_is_the_work_ahead_over_the_measured_throughput() -> None:
    gate = threading.Event()

    def engine(items: list[Item]) -> list[str | Exception]:
        if items[0].text == "measure":
            time.sleep(0.2)  # 100 tokens in 0.2 s: 500 tokens/s
        else:
            assert gate.wait(10)
        return [it.text for it in items]

    policy = BatchPolicy(max_wait_s=0.001, max_batch_size=1, max_queue=3)
    queue: RequestQueue[Item, str] = RequestQueue(
        f"test-queue-{next(_names)}", lambda item: item.cost, policy, WholeBatchExecutor(engine)
    )
    queue.start()
    try:
        await queue.submit([Item("measure", 100)], 5)
        running = asyncio.ensure_future(queue.submit([Item("running", 500)], 10))
        queued = asyncio.ensure_future(queue.submit([Item("a", 1000), Item("b", 1000)], 10))
        await wait_for(lambda: queue.queued == 2)
        with pytest.raises(QueueFull) as refused:
            await queue.submit([Item("c"), Item("d")], 10)
        assert refused.value.retry_after_s in (5, 6)  # (500 running + 2000 queued) / ~500 per second
        gate.set()
        await asyncio.gather(running, queued)
    finally:
        gate.set()
        await queue.close()


async def test_a_later_request_gets_a_place_in_the_next_batch(
    make: Callable[..., RequestQueue[Item, str]],
) -> None:
    gate = threading.Event()
    engine = Recorder(gate)
    queue = make(engine, max_batch_size=3)
    blocker = asyncio.ensure_future(queue.submit([Item("blocker")], 10))
    await wait_for(lambda: len(engine.batches) == 1)
    document = asyncio.ensure_future(queue.submit([Item(f"s{i}", 5) for i in range(9)], 10))
    await wait_for(lambda: queue.queued == 9)
    short = asyncio.ensure_future(queue.submit([Item("hello", 1)], 10))
    await wait_for(lambda: queue.queued == 10)
    gate.set()
    await asyncio.gather(blocker, document, short)
    assert "hello" in engine.batches[1]  # not behind all nine sentences of the earlier request


async def test_small_work_runs_on_the_express_worker_while_a_long_batch_holds_the_others(
    make: Callable[..., RequestQueue[Item, str]],
) -> None:
    gate = threading.Event()
    engine = Recorder()

    def slow_or_fast(items: list[Item]) -> list[str | Exception]:
        results = engine(items)
        if any(it.cost > 8 for it in items):
            assert gate.wait(10)
        return results

    queue = make(slow_or_fast, express_max_tokens=8)
    long = asyncio.ensure_future(queue.submit([Item("long", 100)], 10))
    await wait_for(lambda: len(engine.batches) == 1)
    more_long = asyncio.ensure_future(queue.submit([Item("also long", 50)], 10))
    assert await asyncio.wait_for(queue.submit([Item("short", 3), Item("tiny", 2)], 10), 2) == [
        "SHORT",
        "TINY",
    ]
    assert not more_long.done()  # too large for the express worker: waits for a regular one
    document = asyncio.ensure_future(queue.submit([Item(f"s{i}", 1) for i in range(9)], 10))
    await asyncio.sleep(0.2)
    assert not document.done()  # small sentences, but of a request over the express budget
    gate.set()
    assert await long == ["LONG"] and await more_long == ["ALSO LONG"]
    assert len(await document) == 9


async def test_without_an_express_worker_small_work_waits(
    make: Callable[..., RequestQueue[Item, str]],
) -> None:
    gate = threading.Event()
    engine = Recorder(gate)
    queue = make(engine)
    long = asyncio.ensure_future(queue.submit([Item("long", 100)], 10))
    await wait_for(lambda: len(engine.batches) == 1)
    short = asyncio.ensure_future(queue.submit([Item("short", 3)], 10))
    await asyncio.sleep(0.1)
    assert not short.done() and queue.queued == 1
    gate.set()
    await asyncio.gather(long, short)
