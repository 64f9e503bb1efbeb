"""The request queue with the continuous executor on a tiny real model: sentences join and leave
the running decode at every step, with results equal to decoding alone, slots freed on cancel,
failures contained and the decode memory bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.session import SessionConfig
from service.engine.translation import search
from service.engine.translation.running import RunningDecode
from service.engine.translation.sentence_search import SentenceSearch
from service.engine.translation.slots import SlotDecoder
from service.engine.translation.translator import OnnxTranslator
from service.queue import (
    BatchPolicy,
    ContinuousExecutor,
    DecodeBudget,
    DecodeTooLarge,
    EngineFailure,
    QueueFull,
    RequestQueue,
)

pytestmark = pytest.mark.anyio

SHORT = ["red", "the cat", "two dogs run", "a man rides a bike"]
LONG = [
    "big red dogs sit on a man",
    "dogs sits street street bike cat",
    "a small cat sits on the big red street",
]
ContinuousQueue = RequestQueue[TranslateItem, Translation | Exception]
ENDLESS = 39  # the max_length of sentences that ignore </s> (see ``endless``; the model allows 40)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def endless(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sentences with max_length ``ENDLESS`` ignore </s> and decode to their limit (each through
    its own ``SentenceSearch``): long decodes from the tiny model, whose own outputs are a few
    tokens."""
    real = SentenceSearch.advance

    def advance(self: SentenceSearch, candidates: Any, attention: Any, eos_id: int) -> Any:
        return real(self, candidates, attention, -1 if self.max_len == ENDLESS else eos_id)

    monkeypatch.setattr(SentenceSearch, "advance", advance)
    steps_alone = search.steps_in_batch
    monkeypatch.setattr(search, "steps_in_batch", lambda s: s.max_len != ENDLESS and steps_alone(s))


@pytest.fixture(scope="module")
def engine(translation_artefact: Path) -> OnnxTranslator:
    translator = OnnxTranslator(translation_artefact, SessionConfig("cpu", 1))
    assert translator.joins_midway
    translator.warmup()
    return translator


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Rows of every decoder step; each step slowed to 4 ms so that timing is not a race."""
    rows: list[int] = []
    real = RunningDecode.step

    def step(self: RunningDecode) -> Any:
        rows.append(self.rows)
        time.sleep(0.004)
        return real(self)

    monkeypatch.setattr(RunningDecode, "step", step)
    yield rows


def queue_for(
    engine: OnnxTranslator,
    memory_bytes: int = 64 << 20,
    max_rows: int = 512,
    policy: BatchPolicy | None = None,
) -> ContinuousQueue:
    return RequestQueue(
        engine.name,
        lambda item: engine.count_tokens(item.text),
        policy or BatchPolicy(max_batch_size=32, max_queue=1024),
        ContinuousExecutor(engine, DecodeBudget(memory_bytes, max_rows, 4096)),
    )


@pytest.fixture
async def queue(engine: OnnxTranslator) -> AsyncIterator[ContinuousQueue]:
    b = queue_for(engine)
    b.start()
    yield b
    await b.close()


def items(texts: list[str], **options: Any) -> list[TranslateItem]:
    return [TranslateItem(t, TranslateOptions(**options)) for t in texts]


def same(got: Translation | Exception, alone: Translation | Exception) -> None:
    """The same tokens and texts; scores and alignments equal up to float rounding (the padding
    of a shared step changes summation order, never a choice)."""
    assert isinstance(got, Translation) and isinstance(alone, Translation), (got, alone)
    assert [h.tokens for h in got.hypotheses] == [h.tokens for h in alone.hypotheses]
    assert [h.text for h in got.hypotheses] == [h.text for h in alone.hypotheses]
    for g, a in zip(got.hypotheses, alone.hypotheses, strict=True):
        assert g.score == pytest.approx(a.score, rel=1e-5)
        assert (g.alignment is None) == (a.alignment is None)
        if g.alignment is not None and a.alignment is not None:
            assert np.allclose(g.alignment, a.alignment, atol=1e-5)


@pytest.mark.usefixtures("endless")
async def test_a_sentence_sent_while_a_long_batch_decodes_finishes_before_it(
    queue: ContinuousQueue, steps: list[int]
) -> None:
    done: list[str] = []

    async def send(name: str, batch: list[TranslateItem]) -> None:
        await queue.submit(batch, 30)
        done.append(name)

    long = asyncio.create_task(send("long", items(LONG, beam_size=4, max_length=ENDLESS)))
    while len(steps) < 3:  # the long batch is decoding
        await asyncio.sleep(0.001)
    await send("short", items(["red"], beam_size=4))
    assert done == ["short"]
    await long
    assert done == ["short", "long"]


@pytest.mark.usefixtures("endless")
async def test_sentences_that_join_a_running_decode_get_the_same_result_as_alone(
    engine: OnnxTranslator, queue: ContinuousQueue, steps: list[int]
) -> None:
    """Different beams, n-best, length penalties and limits, sent at different steps."""
    requests = [
        items(LONG[:2], beam_size=4, n_best=2, max_length=ENDLESS, alignments=True),
        items(SHORT[:2], beam_size=1),
        items(SHORT[2:], beam_size=3, n_best=3, length_penalty=0.6, alignments=True),
        items(LONG[2:], beam_size=2, max_length=17),
        items(SHORT[1:3], beam_size=2, max_length=ENDLESS),
    ]
    tasks = []
    for request in requests:
        tasks.append(asyncio.create_task(queue.submit(request, 30)))
        start = len(steps)
        while len(steps) < start + 2:  # join two steps later
            await asyncio.sleep(0.001)
    results = await asyncio.gather(*tasks)
    for request, got in zip(requests, results, strict=True):
        for item, result in zip(request, got, strict=True):
            (alone,) = engine.translate([item])
            same(result, alone)
    assert max(steps) > min(steps)  # rows did join and leave


@pytest.mark.usefixtures("endless")
async def test_a_cancelled_request_frees_its_rows_at_the_next_step(
    queue: ContinuousQueue, steps: list[int]
) -> None:
    task = asyncio.create_task(queue.submit(items(LONG, beam_size=4, max_length=ENDLESS), 30))
    while len(steps) < 3:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    cancelled_at = len(steps)
    await asyncio.sleep(0.1)
    assert len(steps) <= cancelled_at + 1  # at most the step already running
    assert queue.queued == 0 and await queue.drain(1)


def fail_once(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
    """``owner.name`` raises on its first call, then works again."""
    real = getattr(owner, name)
    failures = iter([True])

    def once(*args: Any) -> Any:
        if next(failures, False):
            raise RuntimeError("injected failure")
        return real(*args)

    monkeypatch.setattr(owner, name, once)


async def assert_fails_once_then_serves(queue: ContinuousQueue) -> None:
    failed = await queue.submit(items(SHORT[:2]), 30)
    assert all(isinstance(r, EngineFailure) for r in failed)
    after = await queue.submit(items(SHORT[:2]), 30)
    assert all(isinstance(r, Translation) for r in after)
    assert await queue.drain(1)


async def test_a_failing_step_fails_its_sentences_and_the_decode_goes_on(
    queue: ContinuousQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_once(monkeypatch, RunningDecode, "step")  # onnxruntime raising in one step
    await assert_fails_once_then_serves(queue)


async def test_the_decode_stays_within_its_memory_budget(
    engine: OnnxTranslator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sentences wait for room instead of allocating; one that could never fit is refused."""
    decode = engine.new_decode()
    one = decode.shape.footprint(4, 1, ENDLESS, max(engine.count_tokens(t) for t in LONG))
    budget = 2 * one + one // 2  # room for two long beam-4 sentences at a time
    worst: list[int] = []
    held: list[int] = []  # what the slot buffers really take
    real = RunningDecode.step

    def step(self: RunningDecode) -> Any:
        worst.append(self.worst_bytes())
        assert isinstance(self.decoder, SlotDecoder)
        held.append(self.decoder.nbytes)
        return real(self)

    monkeypatch.setattr(RunningDecode, "step", step)
    b = queue_for(engine, memory_bytes=budget)
    b.start()
    try:
        results = await b.submit(items(LONG, beam_size=4, max_length=ENDLESS), 30)
        assert all(isinstance(r, Translation) for r in results)
        assert max(worst) <= budget and max(worst) > one  # full, never over
        assert max(held) <= max(worst)
        (refused,) = await b.submit(items(["red"], beam_size=16, max_length=ENDLESS), 30)
        assert isinstance(refused, DecodeTooLarge) and refused.limit == budget
    finally:
        await b.close()


@pytest.mark.usefixtures("endless")
async def test_a_small_request_passes_a_full_decode_through_the_express_share(
    engine: OnnxTranslator, steps: list[int]
) -> None:
    """Long sentences fill the worker thread's share (three quarters of the budget); a one-word
    request still starts at once, in the express decode, and ends long before them."""
    one = engine.new_decode().shape.footprint(4, 1, ENDLESS, max(engine.count_tokens(t) for t in LONG))
    policy = BatchPolicy(max_batch_size=32, max_queue=1024, express_max_tokens=8)
    b = queue_for(engine, memory_bytes=4 * one, policy=policy)  # the worker's share: three long sentences
    b.start()
    try:
        long = asyncio.create_task(b.submit(items(LONG * 3, beam_size=4, max_length=ENDLESS), 60))
        while len(steps) < 3:
            await asyncio.sleep(0.001)
        start = len(steps)
        (short,) = await b.submit(items(["red"], beam_size=4, max_length=10), 30)
        assert isinstance(short, Translation)
        assert len(steps) - start < 2 * 10 + 4  # its own steps, interleaved with the worker's
        assert not long.done()
        assert all(isinstance(r, Translation) for r in await long)
    finally:
        await b.close()


@pytest.mark.usefixtures("endless")
async def test_a_small_request_goes_to_the_express_decode_while_the_worker_thread_runs_many_rows(
    engine: OnnxTranslator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker thread's decode has room but runs more rows than ``EXPRESS_ABOVE_ROWS`` (its steps are
    slow): a small request then runs in the express decode."""
    import threading

    import service.queue.admission as admission

    monkeypatch.setattr(admission, "EXPRESS_ABOVE_ROWS", 8)
    stepped: list[tuple[str, int]] = []
    real = RunningDecode.step

    def step(self: RunningDecode) -> Any:
        name = threading.current_thread().name
        stepped.append((name, self.rows))
        if not name.endswith("express"):
            time.sleep(0.005)  # slow worker steps: the long sentences still run when the short comes
        return real(self)

    monkeypatch.setattr(RunningDecode, "step", step)
    policy = BatchPolicy(max_batch_size=32, max_queue=1024, express_max_tokens=8)
    b = queue_for(engine, policy=policy)
    b.start()
    try:
        long = asyncio.create_task(b.submit(items(LONG, beam_size=4, max_length=ENDLESS), 60))
        while sum(rows >= 8 for _, rows in stepped) < 2:  # 3 × 4 rows on the worker's decode, published
            await asyncio.sleep(0.001)
        (short,) = await b.submit(items(["red"], beam_size=4, max_length=10), 30)
        assert isinstance(short, Translation)
        assert {name for name, _ in stepped} == {f"decode-{engine.name}-0", f"decode-{engine.name}-express"}
        assert all(isinstance(r, Translation) for r in await long)
    finally:
        await b.close()


@pytest.mark.usefixtures("endless")
async def test_the_queue_stays_bounded_while_sentences_wait_for_room(
    engine: OnnxTranslator, steps: list[int]
) -> None:
    """One long sentence fills the decode, a second waits for room, a third queues: the next
    request is refused with 429 (QueueFull) and nothing is allocated for it."""
    one = engine.new_decode().shape.footprint(4, 1, ENDLESS, max(engine.count_tokens(t) for t in LONG))
    policy = BatchPolicy(max_batch_size=1, max_queue=1)
    b = queue_for(engine, memory_bytes=one, policy=policy)
    b.start()
    try:
        running = []
        for text in LONG:
            running.append(asyncio.create_task(b.submit(items([text], beam_size=4, max_length=ENDLESS), 60)))
            while not steps:  # the first one decodes
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)  # handed over (and admitted, or waiting), or queued
        assert b.queued == 1
        with pytest.raises(QueueFull):
            await b.submit(items(["red"]), 60)
        assert all(isinstance(r, Translation) for rs in await asyncio.gather(*running) for r in rs)
    finally:
        await b.close()


async def test_an_unexpected_error_in_the_decode_loop_fails_only_what_is_in_flight(
    queue: ContinuousQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.queue.continuous as continuous

    fail_once(monkeypatch, continuous, "fair")  # a bug in the loop itself
    await assert_fails_once_then_serves(queue)


@pytest.mark.usefixtures("endless")
async def test_small_sentences_spread_over_the_worker_threads_and_leave_the_express_one_idle(
    engine: OnnxTranslator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small requests go to the least busy worker thread with room, so both workers' decodes run
    and their steps overlap on two threads, while the express decode (for when they are full or
    busy) stays idle; results equal decoding alone."""
    import threading

    spans: list[tuple[str, float, float]] = []
    real = RunningDecode.step

    def step(self: RunningDecode) -> Any:
        start = time.perf_counter()
        time.sleep(0.01)  # stands for onnxruntime's step, which releases the GIL
        out = real(self)
        spans.append((threading.current_thread().name, start, time.perf_counter()))
        return out

    monkeypatch.setattr(RunningDecode, "step", step)
    policy = BatchPolicy(max_batch_size=32, max_queue=1024, express_max_tokens=8, worker_threads=2)
    b = queue_for(engine, policy=policy)
    b.start()
    try:
        batch = items(SHORT, beam_size=2, max_length=ENDLESS)
        results = await asyncio.gather(*(b.submit([item], 30) for item in batch))
    finally:
        await b.close()
    threads = {name for name, _, _ in spans}
    assert threads == {f"decode-{engine.name}-0", f"decode-{engine.name}-1"}  # each on its own thread
    overlapping = [(a, b2) for a in spans for b2 in spans if a[0] != b2[0] and a[1] < b2[2] and b2[1] < a[2]]
    assert overlapping
    monkeypatch.setattr(RunningDecode, "step", real)  # alone, below: unrecorded
    alone = engine.translate(items(SHORT, beam_size=2, max_length=ENDLESS))
    for (got,), want in zip(results, alone, strict=True):
        same(got, want)


@pytest.mark.usefixtures("endless")
async def test_a_many_sentence_request_is_dealt_out_to_every_worker_thread(
    engine: OnnxTranslator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two worker threads there are two decodes: one request's sentences are dealt out to
    both (about half each, most of them at the first pause), which step side by side; results
    equal decoding alone."""
    import threading

    rows: dict[str, int] = {}
    first: dict[str, int] = {}
    real = RunningDecode.step

    def step(self: RunningDecode) -> Any:
        name = threading.current_thread().name
        rows[name] = max(rows.get(name, 0), self.rows)
        first.setdefault(name, self.rows)
        time.sleep(0.005)  # stands for onnxruntime's step, which releases the GIL
        return real(self)

    monkeypatch.setattr(RunningDecode, "step", step)
    policy = BatchPolicy(max_batch_size=32, max_queue=1024, worker_threads=2)
    b = queue_for(engine, policy=policy)
    b.start()
    batch = items([*SHORT, *LONG, *SHORT, *LONG], beam_size=2, max_length=ENDLESS)
    try:
        results = await b.submit(batch, 30)
    finally:
        await b.close()
    assert sorted(rows) == [f"decode-{engine.name}-0", f"decode-{engine.name}-1"]
    assert all(len(batch) // 2 <= r // 2 <= len(batch) // 2 + 2 for r in rows.values()), rows
    assert all(r // 2 >= 4 for r in first.values()), first  # not one sentence per worker and step
    monkeypatch.setattr(RunningDecode, "step", real)
    for got, want in zip(results, engine.translate(batch), strict=True):
        same(got, want)
