"""Iteration-level ("continuous") batching for translation: sentences join and leave the running
decode between any two decoder steps.

``DynamicBatcher`` forms a batch, decodes it to the end and only then starts the next, so a short
sentence that arrives while long ones decode waits for all of them. ``ContinuousBatcher`` keeps
the batcher's request side (queue bound → 429, deadlines → 504, disconnects, fair order, drain)
and replaces its execution: a ``RunningDecode`` (``service/engine/running.py``) per lane, each
driven by its own thread: ``BatchPolicy.workers`` main lanes, and with
``BatchPolicy.express_max_tokens`` an express lane with a quarter of the budget for small
requests only, which takes them when the main lanes are full or busy, so a one-word request is
never held behind long ones. Between two steps of its decode a lane thread

* prepares (tokenizes) what the event loop handed over, answering at once what fails or could
  never fit, even alone (``DecodeTooLarge`` → 422);
* admits waiting sentences, oldest first (each request's oldest before any request's second:
  ``_fair``), while its decode's worst-case memory (every row at its own length limit and the
  longest source: ``RunningDecode.worst_bytes``) stays within its share of
  ``DecodeBudget.memory_bytes``, the rows of all lanes within ``max_rows`` and the sentences
  encoded in one pause within ``admit_tokens`` (so encoding never stalls the decode for long);
  the sentences are dealt out to the less busy main lanes (a many-sentence request runs on
  every one); the express lane takes a small request's sentence only when no main lane that
  has room for it runs fewer than ``EXPRESS_ABOVE_ROWS`` rows;
* takes out the sentences nobody waits for any more (client gone, deadline passed: the request
  side sets ``TranslateItem.abandoned``), freeing their rows at once;
* runs one step over every running row and answers the step's finished sentences at once.

The lanes run side by side, like the batcher's workers: one's Python search overlaps the other's
onnxruntime step. A step that raises fails the sentences in it (``EngineFailure`` → 500); the
sentences still waiting go on in a fresh decode. Results do not depend on what else runs: each
sentence's search reads only its own rows (``search.py``). This module knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from service.batch_forming import BatchPolicy, Pending, round_robin
from service.batching import BatcherClosed, DynamicBatcher, EngineFailure
from service.engine.base import Abandoned, TranslateItem, Translation
from service.engine.running import ContinuousEngine, RunningDecode
from service.engine.search import TokenHypothesis
from service.engine.tokenizer import Encoded
from service.metrics import (
    ADMITTED_PER_STEP,
    DECODE_FREE_ROWS,
    DECODE_RUNNING,
    DECODE_STEP,
    ITEM_ERRORS,
    observe_stage,
)

log = logging.getLogger(__name__)

SentencePending = Pending[TranslateItem, "Translation | Exception"]
EXPRESS_SHARE = 0.25  # of the decode memory budget, only for sentences of small requests
# The express decode takes a small request's sentence only when no main decode with room for it
# runs fewer rows than this (a main step of 64 rows of the default model takes about 5 ms): a
# third decode stepping on two cores slowed every step (benchmarks/README.md, "Express").
EXPRESS_ABOVE_ROWS = 64


class DecodeTooLarge(ValueError):
    """A sentence whose beams at its length limit exceed the decode memory budget on their own:
    it could never be admitted (→ 422 naming the limit)."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit  # the budget, in bytes


@dataclass(frozen=True)
class DecodeBudget:
    memory_bytes: int  # worst-case cache + memory of the running rows
    max_rows: int  # sentences × beams at once
    admit_tokens: int  # source tokens encoded in one pause between two steps


@dataclass
class _Sentence:
    pending: SentencePending
    source: Encoded
    alone: int  # bytes its beams take at its length limit: what it needs of a decode's share


@dataclass
class _Lane:
    """A running decode, driven by its own thread, and the share of the memory budget it may take.

    ``rows`` and ``free`` are what the other lane may read of it (published by its own thread;
    the decode itself is touched by its thread only)."""

    decode: RunningDecode
    share: int  # bytes
    express: bool = False  # only for sentences of small requests
    running: dict[int, _Sentence] = field(default_factory=dict)  # by search key
    rows: int = 0
    free: int = 0  # more rows of the widest kind that would fit its share

    def takes(self, sentence: _Sentence) -> bool:
        """Whether the sentence is of this lane's class and could run here, alone at least."""
        return (sentence.pending.small or not self.express) and sentence.alone <= self.share

    def has_room(self, sentence: _Sentence) -> bool:
        """Whether it takes the sentence and has room for its beams now (as last published)."""
        return self.takes(sentence) and self.free >= sentence.pending.item.options.beam_size


class ContinuousBatcher(DynamicBatcher[TranslateItem, "Translation | Exception"]):
    """A translation model's queue with iteration-level decoding, a thread per decode."""

    def __init__(
        self,
        engine: ContinuousEngine,
        cost: Callable[[TranslateItem], int],
        policy: BatchPolicy,
        budget: DecodeBudget,
    ) -> None:
        super().__init__(
            engine.name, engine.translate, cost, policy, on_abandon=lambda item: item.abandoned.set()
        )
        self._engine = engine
        self.budget = budget
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the inbox or the waiting sentences changed
        self._inbox: list[SentencePending] = []  # handed over by the event loop, not yet prepared
        self._waiting: list[_Sentence] = []  # prepared, not admitted yet, in ``_fair`` order
        self._closing = False
        self._staged = 0  # items handed over and not yet admitted (event-loop side)
        self._keys = itertools.count()
        self._lanes: list[_Lane] = []
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._running_gauge = DECODE_RUNNING.labels(model=self.model)
        self._free_gauge = DECODE_FREE_ROWS.labels(model=self.model)
        self._step_time = DECODE_STEP.labels(model=self.model)
        self._admitted = ADMITTED_PER_STEP.labels(model=self.model)
        self._errors = ITEM_ERRORS.labels(model=self.model)

    # ---- the event-loop side ------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = self._event_loop = asyncio.get_running_loop()
        self._lanes = self._new_lanes()
        for i, lane in enumerate(self._lanes):
            self._show(lane)
            name = f"decode-{self.model}-" + ("express" if lane.express else str(i))
            threading.Thread(target=self._drive, args=(lane,), name=name, daemon=True).start()
        try:
            while True:
                self._purge(loop.time())
                if self._queue and self._staged < self.policy.max_batch_size:
                    self._hand_over(self._take_batch())
                    continue
                if self._queue and (small := self._take_small()):  # not held behind staged ones
                    self._hand_over(small)
                    continue
                self._wakeup.clear()
                await self._wakeup.wait()
        finally:
            self._stop_threads()

    def _hand_over(self, batch: list[SentencePending]) -> None:
        cost = sum(p.cost for p in batch)
        self._stats.running += len(batch)
        self._stats.running_cost += cost
        self._staged += len(batch)
        now = time.perf_counter()
        for pending in batch:
            observe_stage(self.model, "queue", now - pending.enqueued)
        with self._work:
            self._inbox.extend(batch)
            self._work.notify_all()

    def _deliver(self, pending: SentencePending, result: Translation | Exception) -> None:
        """On the event loop: one sentence's result (or error) to its request."""
        if isinstance(result, Exception) and not isinstance(result, Abandoned):
            self._errors.inc()
        if not pending.future.done():
            pending.future.set_result(result)
            observe_stage(self.model, "total", time.perf_counter() - pending.enqueued)
        self._stats.running -= 1
        self._stats.running_cost -= pending.cost
        self._stats.done.set()

    def _deliver_all(self, answers: list[tuple[SentencePending, Translation | Exception]]) -> None:
        """On the event loop: the results of a step's finished sentences (one hand-off a step)."""
        for pending, result in answers:
            self._deliver(pending, result)

    def _admitted_from_inbox(self, n: int) -> None:
        self._staged -= n
        self._wakeup.set()

    def _post(self, callback: Any, *args: Any) -> None:
        """Run ``callback`` on the event loop (from a decode thread)."""
        assert self._event_loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._event_loop.call_soon_threadsafe(callback, *args)

    async def close(self) -> None:
        self._stop_threads()
        await super().close()

    def _stop_threads(self) -> None:
        with self._work:
            self._closing = True
            self._work.notify_all()

    # ---- the decode threads -------------------------------------------------------------------

    def _new_lanes(self) -> list[_Lane]:
        """``BatchPolicy.workers`` main decodes sharing the budget equally, and with express
        requests on (``BatchPolicy.express_max_tokens``) an express decode with
        ``EXPRESS_SHARE`` of it, for small requests only: a one-word request then finds room
        within a step or two however long the main decodes' sentences run, and its short limit
        does not pad theirs (each decode's cache has its own width)."""
        total = self.budget.memory_bytes
        express = int(total * EXPRESS_SHARE) if self.policy.express_max_tokens else 0
        workers = self.policy.workers
        lanes = [_Lane(self._engine.new_decode(), (total - express) // workers) for _ in range(workers)]
        if express:
            lanes.append(_Lane(self._engine.new_decode(), express, True))
        return lanes

    def _drive(self, lane: _Lane) -> None:
        """A lane's thread: between two steps of its decode, prepare what was handed over, admit
        what fits, drop what nobody waits for; then step. The lanes run side by side (one's
        Python search overlaps the other's onnxruntime step, which releases the GIL)."""
        while True:
            with self._work:
                while not (self._closing or lane.running or self._inbox or self._work_for(lane)):
                    self._work.wait()
                if self._closing:
                    break
                batch, self._inbox = self._inbox, []
            held: list[_Sentence] = []  # prepared here, not yet among the waiting
            try:
                held = self._prepare(batch)
                self._admit_waiting(lane, held)
                held = []
                self._drop_abandoned(lane)
                if lane.running:
                    self._step(lane)
                self._show(lane)
            except Exception:  # a bug, not a model failure: fail what is in flight, serve on
                log.exception("%s: the decode loop failed", self.model)
                self._fail(EngineFailure(f"{self.model}: decoding failed"), [*held, *lane.running.values()])
                self._post(self._admitted_from_inbox, len(held))
                self._reset(lane)
        with self._work:
            self._fail(BatcherClosed(f"{self.model}: shutting down"), [*lane.running.values()])
            self._fail(BatcherClosed(f"{self.model}: shutting down"), self._waiting)
            for pending in self._inbox:
                self._post(self._deliver, pending, BatcherClosed(f"{self.model}: shutting down"))
            self._post(self._admitted_from_inbox, len(self._waiting) + len(self._inbox))
            self._waiting, self._inbox = [], []

    def _work_for(self, lane: _Lane) -> bool:
        return any(
            (lane.takes(s) and not self._left_to_main(lane, s)) or s.pending.item.abandoned.is_set()
            for s in self._waiting
        )

    def _left_to_main(self, lane: _Lane, sentence: _Sentence) -> bool:
        """The express lane leaves a sentence to the main lanes while one has room for it and
        runs few enough rows to step about as fast."""
        return lane.express and any(
            o.has_room(sentence) and o.rows < EXPRESS_ABOVE_ROWS for o in self._lanes if not o.express
        )

    def _prepare(self, batch: list[SentencePending]) -> list[_Sentence]:
        """Tokenize and check the handed-over items; those that fail, need no decoding (an empty
        text) or could never fit any decode's share are answered at once."""
        if not batch:
            return []
        items = [p.item for p in batch]
        results: list[Translation | Exception | None] = [None] * len(batch)
        try:
            todo = self._engine.prepare(items, results)
        except Exception as e:
            todo, results = {}, [e] * len(batch)
        prepared = []
        shape, limit = self._lanes[0].decode.shape, self._lanes[0].decode.limit
        for i, (pending, result) in enumerate(zip(batch, results, strict=True)):
            if i not in todo:
                assert result is not None
                self._post(self._deliver, pending, result)
                continue
            options, n = pending.item.options, todo[i].n_tokens
            sentence = _Sentence(pending, todo[i], shape.footprint(options.beam_size, 1, limit(options), n))
            room = max(lane.share for lane in self._lanes if pending.small or not lane.express)
            if sentence.alone > room:
                self._post(self._deliver, pending, _too_large(pending.item, sentence.alone, room))
                continue
            prepared.append(sentence)
        self._post(self._admitted_from_inbox, len(batch) - len(prepared))
        return prepared

    def _admit_waiting(self, lane: _Lane, prepared: list[_Sentence]) -> None:
        """Join ``prepared`` to the waiting sentences, then move those this lane takes into its
        decode, in ``_fair`` order, none overtaking an earlier one of its class (small or not)."""
        with self._work:
            self._waiting = _fair(self._waiting + prepared)
            chosen, for_others = self._choose(lane)
            if prepared or for_others:
                self._work.notify_all()  # another lane may take some
        if chosen:
            self._post(self._admitted_from_inbox, len(chosen))
            self._admitted.observe(len(chosen))
            self._admit_into(lane, chosen)

    def _choose(self, lane: _Lane) -> tuple[list[_Sentence], bool]:
        """Under the lock: take out of the waiting sentences those ``lane`` admits now, and
        whether another lane should look (some were dealt to one, or a small one waits for room
        here: the express lane's). They are dealt out in turn: one goes to another main lane that
        takes it when that lane runs fewer rows than this one (counting what this pass dealt to
        each) and has room for it; that lane's own thread admits it. The express lane takes only
        what ``_left_to_main`` leaves it."""
        others = [other for other in self._lanes if other is not lane and not other.express]
        load = {id(other): other.rows for other in others}  # their rows, and what this pass dealt them
        room = {id(other): other.free for other in others}
        chosen: list[_Sentence] = []
        rows = sum(other.rows for other in self._lanes if other is not lane) + lane.decode.rows
        tokens = 0
        blocked: set[bool] = set()  # classes (small or not) whose earlier sentence waits for room
        dealt = False
        for sentence in list(self._waiting):
            item, small = sentence.pending.item, sentence.pending.small
            if item.abandoned.is_set():
                self._waiting.remove(sentence)
                self._post(self._admitted_from_inbox, 1)
                self._post(self._deliver, sentence.pending, Abandoned("nobody waits any more"))
                continue
            if not lane.takes(sentence) or small in blocked or self._left_to_main(lane, sentence):
                continue
            k, n = item.options.beam_size, sentence.source.n_tokens
            if lane.running or chosen:
                mine = lane.rows + sum(s.pending.item.options.beam_size for s in chosen)
                idle = [o for o in others if o.takes(sentence) and load[id(o)] < mine and room[id(o)] >= k]
                if idle:  # the least busy lane takes it
                    other = min(idle, key=lambda o: load[id(o)])
                    load[id(other)] += k
                    room[id(other)] -= k
                    dealt = True
                    continue
                fits = lane.decode.can_admit() and self._fits(lane, chosen, sentence)
                if not fits or rows + k > self.budget.max_rows:
                    blocked.add(small)  # it waits for rows to free; none of its class overtakes
                    continue
            if tokens and tokens + n > self.budget.admit_tokens:
                break
            self._waiting.remove(sentence)
            chosen.append(sentence)
            rows += k
            tokens += n
        return chosen, dealt or (True in blocked and not lane.express)

    @staticmethod
    def _fits(lane: _Lane, chosen: list[_Sentence], sentence: _Sentence) -> bool:
        extra = [(s.pending.item.options, s.source.n_tokens) for s in [*chosen, sentence]]
        return lane.decode.worst_bytes(extra) <= lane.share

    def _admit_into(self, lane: _Lane, sentences: list[_Sentence]) -> None:
        entries = []
        for sentence in sentences:
            key = next(self._keys)
            lane.running[key] = sentence
            entries.append((key, sentence.source, sentence.pending.item.options))
        try:
            done = lane.decode.admit(entries)
        except Exception as e:  # the encoder failed for these: they fail, the running ones go on
            log.exception("%s: encoder failed for %d sentences", self.model, len(sentences))
            failure = EngineFailure(f"{self.model}: encoder failed: {type(e).__name__}")
            self._fail(failure, [lane.running.pop(key) for key, _, _ in entries])
            return
        if done:
            self._answer([(lane.running.pop(s.key), s.results()) for s in done])

    def _drop_abandoned(self, lane: _Lane) -> None:
        """Sentences nobody waits for any more (client gone, deadline passed) leave now."""
        gone = lane.decode.remove(lambda s: lane.running[s.key].pending.item.abandoned.is_set())
        self._fail(Abandoned("nobody waits any more"), [lane.running.pop(s.key) for s in gone])

    def _step(self, lane: _Lane) -> None:
        start = time.perf_counter()
        try:
            finished = lane.decode.step()
        except Exception as e:
            log.exception("%s: decoder step failed for %d sentences", self.model, len(lane.running))
            self._fail(
                EngineFailure(f"{self.model}: decoder step failed: {type(e).__name__}"), lane.running.values()
            )
            self._reset(lane)
            return
        self._step_time.observe(time.perf_counter() - start)
        if finished:
            self._answer([(lane.running.pop(s.key), s.results()) for s in finished])

    def _answer(self, done: list[tuple[_Sentence, list[TokenHypothesis]]]) -> None:
        """Detokenize finished sentences and answer their requests."""
        items = [s.pending.item for s, _ in done]
        todo = {i: s.source for i, (s, _) in enumerate(done)}
        hyps = {i: found for i, (_, found) in enumerate(done)}
        results: list[Translation | Exception | None] = [None] * len(done)
        try:
            self._engine.finish(items, todo, hyps, results)
        except Exception as e:
            results = [e] * len(done)
        answers = []
        for (sentence, _), result in zip(done, results, strict=True):
            assert result is not None
            answers.append((sentence.pending, result))
        self._post(self._deliver_all, answers)

    def _fail(self, error: Exception, sentences: Iterable[_Sentence]) -> None:
        for sentence in list(sentences):
            self._post(self._deliver, sentence.pending, error)

    def _reset(self, lane: _Lane) -> None:
        lane.decode, lane.running = self._engine.new_decode(), {}
        self._show(lane)

    def _show(self, lane: _Lane) -> None:
        """Publish the lane's rows and room (for the other lane and the gauges)."""
        d = lane.decode
        lane.rows = d.rows
        widest = d.shape.footprint(1, 1, d.shape.max_target_len, max(d.decoder.source_len, 1))  # a greedy one
        lane.free = max(0, lane.share - d.worst_bytes()) // widest
        self._running_gauge.set(sum(len(other.running) for other in self._lanes))
        free = sum(other.free for other in self._lanes)
        self._free_gauge.set(min(free, self.budget.max_rows - sum(other.rows for other in self._lanes)))


def _too_large(item: TranslateItem, need: int, room: int) -> DecodeTooLarge:
    o = item.options
    return DecodeTooLarge(
        f"beam_size {o.beam_size} × max_length {o.max_length} needs {need / 2**20:.1f} MiB of decoder "
        f"cache, more than the {room / 2**20:.1f} MiB a sentence may use (TSERVE_DECODE_MEMORY_MB): "
        "lower beam_size or max_length",
        room,
    )


def _fair(waiting: list[_Sentence]) -> list[_Sentence]:
    """Admission order: ``round_robin`` over the requests, oldest first."""
    return round_robin(sorted(waiting, key=lambda s: s.pending.enqueued), lambda s: s.pending.request)
