"""Iteration-level ("continuous") batching for translation: sentences join and leave the running
decode between any two decoder steps.

``DynamicBatcher`` forms a batch, decodes it to the end and only then starts the next, so a short
sentence that arrives while long ones decode waits for all of them. ``ContinuousBatcher`` keeps
the batcher's request side (queue bound → 429, deadlines → 504, disconnects, fair order, drain)
and replaces its execution: one decode thread per model drives a ``RunningDecode``
(``service/engine/running.py``). Between two steps it

* admits waiting sentences, oldest first (each request's oldest before any request's second:
  ``_fair``), while the decode's worst-case memory (every row at its own length limit and the
  longest source: ``RunningDecode.worst_bytes``) stays within its share of
  ``DecodeBudget.memory_bytes`` and the sentences encoded in one pause stay within
  ``admit_tokens`` (so encoding never stalls the running decode for long); a sentence that could
  never fit, even alone, fails with ``DecodeTooLarge`` (→ 422) instead of waiting forever. Small
  requests (``BatchPolicy.express_max_tokens``) may also use an express decode with a quarter of
  the budget, so a one-word request is never held behind long ones (``_lanes``);
* takes out the sentences nobody waits for any more (client gone, deadline passed: the request
  side sets ``TranslateItem.abandoned``), freeing their rows at once;
* runs one step over every running row of each decode, the two decodes at once (the second on a
  helper thread, so one's Python search overlaps the other's onnxruntime step; small requests go
  to the less busy decode with room), and answers the step's finished sentences at once.

A step that raises fails the sentences in it (``EngineFailure`` → 500); the sentences still
waiting go on in a fresh decode. Results do not depend on what else runs: each sentence's search
reads only its own rows (``search.py``). This module knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


@dataclass
class _Lane:
    """A running decode and the share of the memory budget it may take."""

    decode: RunningDecode
    share: int  # bytes
    express: bool = False  # only for sentences of small requests


class ContinuousBatcher(DynamicBatcher[TranslateItem, "Translation | Exception"]):
    """A translation model's queue with iteration-level decoding on its own thread."""

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
        self._inbox: list[SentencePending] = []  # handed over by the event loop, not yet seen by the thread
        self._lock = threading.Lock()
        self._work = threading.Event()  # the inbox has items, or the thread must stop
        self._closing = False
        self._staged = 0  # items handed over and not yet admitted (event-loop side)
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running_gauge = DECODE_RUNNING.labels(model=self.model)
        self._free_gauge = DECODE_FREE_ROWS.labels(model=self.model)
        self._step_time = DECODE_STEP.labels(model=self.model)
        self._admitted = ADMITTED_PER_STEP.labels(model=self.model)
        self._errors = ITEM_ERRORS.labels(model=self.model)

    # ---- the event-loop side ------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = self._event_loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._decode_loop, name=f"decode-{self.model}", daemon=True)
        self._thread.start()
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
            self._stop_thread()

    def _hand_over(self, batch: list[SentencePending]) -> None:
        cost = sum(p.cost for p in batch)
        self._stats.running += len(batch)
        self._stats.running_cost += cost
        self._staged += len(batch)
        now = time.perf_counter()
        for pending in batch:
            observe_stage(self.model, "queue", now - pending.enqueued)
        with self._lock:
            self._inbox.extend(batch)
        self._work.set()

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
        """Run ``callback`` on the event loop (from the decode thread)."""
        assert self._event_loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._event_loop.call_soon_threadsafe(callback, *args)

    async def close(self) -> None:
        self._stop_thread()
        await super().close()

    def _stop_thread(self) -> None:
        self._closing = True
        self._work.set()

    # ---- the decode thread --------------------------------------------------------------------

    def _lanes(self) -> list[_Lane]:
        """The main decode, and with express requests on (``BatchPolicy.express_max_tokens``) an
        express decode with ``EXPRESS_SHARE`` of the budget, for small requests only: a one-word
        request then finds room within a step or two however long the main decode's sentences
        run, and its short limit does not pad theirs (each decode's cache has its own width)."""
        total = self.budget.memory_bytes
        if not self.policy.express_max_tokens:
            return [_Lane(self._engine.new_decode(), total)]
        express = int(total * EXPRESS_SHARE)
        return [
            _Lane(self._engine.new_decode(), total - express),
            _Lane(self._engine.new_decode(), express, True),
        ]

    def _decode_loop(self) -> None:
        with ThreadPoolExecutor(1, thread_name_prefix=f"decode-{self.model}-lane") as pool:
            self._decode_until_closed(pool)

    def _decode_until_closed(self, pool: ThreadPoolExecutor) -> None:
        lanes = self._lanes()
        waiting: list[_Sentence] = []  # prepared, not admitted yet
        running: dict[int, _Sentence] = {}
        keys = itertools.count()
        busy = False
        while True:
            if not busy:
                self._work.wait()
            if self._closing:
                self._fail_all(
                    BatcherClosed(f"{self.model}: shutting down"), waiting, running, self._take_inbox()
                )
                return
            waiting += self._prepare(self._take_inbox())
            try:
                waiting[:] = _fair(waiting)
                self._admit_waiting(lanes, waiting, running, keys)
                self._drop_abandoned(lanes, running)
                self._show(lanes)
                busy = any(lane.decode.sentences for lane in lanes)
                self._step_lanes([lane for lane in lanes if lane.decode.sentences], running, pool)
            except Exception:  # a bug, not a model failure: fail what is in flight, serve on
                log.exception("%s: the decode loop failed", self.model)
                failure = EngineFailure(f"{self.model}: decoding failed")
                self._fail_all(failure, waiting, running, [])
                waiting, running, lanes, busy = [], {}, self._lanes(), False

    def _step_lanes(self, busy: list[_Lane], running: dict[int, _Sentence], pool: ThreadPoolExecutor) -> None:
        """One step of every busy lane, the others on ``pool`` while this thread steps the first
        (their decodes share nothing but the onnxruntime session, whose ``run`` is thread-safe)."""
        others = [pool.submit(self._step, lane, running) for lane in busy[1:]]
        try:
            if busy:
                self._step(busy[0], running)
        finally:
            for future in others:
                future.result()  # a bug raised in a lane's step reaches the loop's containment

    def _drop_abandoned(self, lanes: list[_Lane], running: dict[int, _Sentence]) -> None:
        """Sentences nobody waits for any more (client gone, deadline passed) leave now."""
        for lane in lanes:
            for s in lane.decode.remove(lambda s: running[s.key].pending.item.abandoned.is_set()):
                self._post(self._deliver, running.pop(s.key).pending, Abandoned("nobody waits any more"))

    def _step(self, lane: _Lane, running: dict[int, _Sentence]) -> None:
        start = time.perf_counter()
        try:
            finished = lane.decode.step()
        except Exception as e:
            log.exception("%s: decoder step failed for %d sentences", self.model, len(lane.decode.sentences))
            failure = EngineFailure(f"{self.model}: decoder step failed: {type(e).__name__}")
            for s in lane.decode.sentences:
                self._post(self._deliver, running.pop(s.key).pending, failure)
            lane.decode = self._engine.new_decode()
            return
        self._step_time.observe(time.perf_counter() - start)
        if finished:
            self._answer([(running.pop(s.key), s.results()) for s in finished])

    def _take_inbox(self) -> list[SentencePending]:
        with self._lock:
            taken, self._inbox = self._inbox, []
            self._work.clear()
        return taken

    def _prepare(self, batch: list[SentencePending]) -> list[_Sentence]:
        """Tokenize and check the handed-over items; those that fail (or need no decoding: an
        empty text) are answered at once."""
        if not batch:
            return []
        items = [p.item for p in batch]
        results: list[Translation | Exception | None] = [None] * len(batch)
        try:
            todo = self._engine.prepare(items, results)
        except Exception as e:
            todo, results = {}, [e] * len(batch)
        for i, (pending, result) in enumerate(zip(batch, results, strict=True)):
            if i not in todo:
                assert result is not None
                self._post(self._deliver, pending, result)
        self._post(self._admitted_from_inbox, len(batch) - len(todo))
        return [_Sentence(batch[i], source) for i, source in todo.items()]

    def _admit_waiting(
        self, lanes: list[_Lane], waiting: list[_Sentence], running: dict[int, _Sentence], keys: Iterator[int]
    ) -> None:
        """Move the waiting sentences that fit into a decode, in ``_fair`` order, none overtaking
        an earlier one of its class (small or not). A sentence goes to the least busy of its lanes
        with room: the main one, or for small requests also the express one."""
        budget = self.budget
        chosen: dict[int, list[_Sentence]] = {i: [] for i in range(len(lanes))}
        tokens = 0
        blocked = {True: False, False: False}  # a small / large sentence already waits for room
        for sentence in list(waiting):
            item, n, small = sentence.pending.item, sentence.source.n_tokens, sentence.pending.small
            mine = [i for i, lane in enumerate(lanes) if small or not lane.express]
            alone = item.options.beam_size * lanes[0].decode.shape.row_bytes(
                lanes[0].decode.limit(item.options), n
            )
            room = max(lanes[i].share for i in mine)
            if item.abandoned.is_set() or alone > room:
                waiting.remove(sentence)
                self._post(self._admitted_from_inbox, 1)
                self._post(self._deliver, sentence.pending, self._refusal(item, alone, room))
                continue
            if blocked[small]:
                continue
            rows = sum(lane.decode.rows for lane in lanes) + sum(
                s.pending.item.options.beam_size for c in chosen.values() for s in c
            )
            # The least busy lane with room: the lanes step on two threads (``_step_lanes``), so
            # one's Python search overlaps the other's onnxruntime step.
            fitting = [i for i in mine if self._fits(lanes[i], chosen[i], sentence)]
            lane_at = min(fitting, key=lambda i: lanes[i].decode.rows + len(chosen[i]), default=None)
            if lane_at is None or rows + item.options.beam_size > budget.max_rows:
                if any(lanes[i].decode.sentences or chosen[i] for i in mine):  # it waits for rows to free
                    blocked[small] = True
                    continue
                lane_at = mine[0]  # an idle lane takes its first sentence whatever the row cap
            if tokens and tokens + n > budget.admit_tokens:
                break
            chosen[lane_at].append(sentence)
            tokens += n
        taken = sum(len(c) for c in chosen.values())
        if not taken:
            return
        self._post(self._admitted_from_inbox, taken)
        self._admitted.observe(taken)
        for i, sentences in chosen.items():
            for sentence in sentences:
                waiting.remove(sentence)
            if sentences:
                self._admit_into(lanes[i], sentences, running, keys)

    @staticmethod
    def _fits(lane: _Lane, chosen: list[_Sentence], sentence: _Sentence) -> bool:
        extra = [(s.pending.item.options, s.source.n_tokens) for s in [*chosen, sentence]]
        return lane.decode.can_admit() and lane.decode.worst_bytes(extra) <= lane.share

    def _admit_into(
        self, lane: _Lane, sentences: list[_Sentence], running: dict[int, _Sentence], keys: Iterator[int]
    ) -> None:
        entries = []
        for sentence in sentences:
            key = next(keys)
            running[key] = sentence
            entries.append((key, sentence.source, sentence.pending.item.options))
        try:
            done = lane.decode.admit(entries)
        except Exception as e:  # the encoder failed for these: they fail, the running ones go on
            log.exception("%s: encoder failed for %d sentences", self.model, len(sentences))
            failure = EngineFailure(f"{self.model}: encoder failed: {type(e).__name__}")
            for key, _, _ in entries:
                self._post(self._deliver, running.pop(key).pending, failure)
            return
        if done:
            self._answer([(running.pop(s.key), s.results()) for s in done])

    @staticmethod
    def _refusal(item: TranslateItem, need: int, room: int) -> Exception:
        if item.abandoned.is_set():
            return Abandoned("nobody waits any more")
        o = item.options
        return DecodeTooLarge(
            f"beam_size {o.beam_size} × max_length {o.max_length} needs {need / 2**20:.1f} MiB of decoder "
            f"cache, more than the {room / 2**20:.1f} MiB a sentence may use (TSERVE_DECODE_MEMORY_MB): "
            "lower beam_size or max_length",
            room,
        )

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

    def _show(self, lanes: list[_Lane]) -> None:
        self._running_gauge.set(sum(len(lane.decode.sentences) for lane in lanes))
        free = 0
        for lane in lanes:
            d = lane.decode
            widest = d.shape.row_bytes(d.shape.max_target_len, max(d.decoder.source_len, 1))
            free += max(0, lane.share - d.worst_bytes()) // widest
        self._free_gauge.set(min(free, self.budget.max_rows - sum(lane.decode.rows for lane in lanes)))

    def _fail_all(
        self,
        error: Exception,
        waiting: list[_Sentence],
        running: dict[int, _Sentence],
        pending: list[SentencePending],
    ) -> None:
        for p in [*(s.pending for s in waiting), *(s.pending for s in running.values()), *pending]:
            self._post(self._deliver, p, error)
        self._post(self._admitted_from_inbox, len(waiting) + len(pending))


def _fair(waiting: list[_Sentence]) -> list[_Sentence]:
    """Admission order: ``round_robin`` over the requests, oldest first."""
    return round_robin(sorted(waiting, key=lambda s: s.pending.enqueued), lambda s: s.pending.request)
