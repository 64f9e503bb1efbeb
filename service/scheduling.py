"""Iteration-level ("continuous") batching for translation: sentences join and leave the running
decode between any two decoder steps.

``DynamicBatcher`` forms a batch, decodes it to the end and only then starts the next, so a short
sentence that arrives while long ones decode waits for all of them. ``ContinuousBatcher`` keeps
the batcher's request side (queue bound → 429, deadlines → 504, disconnects, fair order, drain)
and replaces its execution: one decode thread per model drives a ``RunningDecode``
(``service/engine/running.py``). Between two steps it

* admits waiting sentences, oldest first, while the decode's worst-case memory (every row at its
  own length limit and the longest source) stays within ``DecodeBudget.memory_bytes`` and the
  sentences encoded in one pause stay within ``admit_tokens`` (so encoding never stalls the
  running decode for long); a sentence that could never fit, even alone, fails with
  ``DecodeTooLarge`` (→ 422) instead of waiting forever;
* takes out the sentences nobody waits for any more (client gone, deadline passed: the request
  side sets ``TranslateItem.abandoned``), freeing their rows at once;
* runs one step over every running row and answers each finished sentence at once.

A step that raises fails the sentences in it (``EngineFailure`` → 500); the sentences still
waiting go on in a fresh decode. Results do not depend on what else runs: each sentence's search
reads only its own rows (``search.py``). This module knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from service.batching import BatcherClosed, BatchPolicy, DynamicBatcher, EngineFailure, _Pending
from service.engine.base import Abandoned, TranslateItem, Translation
from service.engine.running import RunningDecode
from service.engine.search import Hypothesis
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

Pending = _Pending[TranslateItem, "Translation | Exception"]


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


class ContinuousEngine(Protocol):
    name: str

    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]: ...

    def new_decode(self) -> RunningDecode: ...

    def prepare(
        self, items: Sequence[TranslateItem], results: list[Translation | Exception | None]
    ) -> dict[int, Encoded]: ...

    def finish(
        self,
        items: Sequence[TranslateItem],
        todo: dict[int, Encoded],
        hyps: dict[int, list[Hypothesis]],
        results: list[Translation | Exception | None],
    ) -> None: ...


@dataclass
class _Sentence:
    pending: Pending
    source: Encoded


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
        self._inbox: list[Pending] = []  # handed over by the event loop, not yet seen by the thread
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
                self._wakeup.clear()
                await self._wakeup.wait()
        finally:
            self._stop_thread()

    def _hand_over(self, batch: list[Pending]) -> None:
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

    def _deliver(self, pending: Pending, result: Translation | Exception) -> None:
        """On the event loop: one sentence's result (or error) to its request."""
        if isinstance(result, Exception) and not isinstance(result, Abandoned):
            self._errors.inc()
        if not pending.future.done():
            pending.future.set_result(result)
            observe_stage(self.model, "total", time.perf_counter() - pending.enqueued)
        self._stats.running -= 1
        self._stats.running_cost -= pending.cost
        self._stats.done.set()

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

    def _decode_loop(self) -> None:
        decode = self._engine.new_decode()
        waiting: list[_Sentence] = []  # prepared, oldest first, not admitted yet
        running: dict[int, _Sentence] = {}
        keys = iter(range(1 << 62))
        while True:
            if not decode.sentences and not waiting:
                self._work.wait()
            if self._closing:
                self._fail_all([*waiting, *running.values()], *self._take_inbox())
                return
            waiting += self._prepare(self._take_inbox())
            admitted = self._admit_waiting(decode, waiting, running, keys)
            for s in decode.remove(lambda s: running[s.key].pending.item.abandoned.is_set()):
                self._post(self._deliver, running.pop(s.key).pending, Abandoned("nobody waits any more"))
            self._show(decode)
            if not decode.sentences:
                if admitted is None:  # nothing fits yet: wait for work rather than spin
                    self._work.clear()
                continue
            start = time.perf_counter()
            try:
                finished = decode.step()
            except Exception as e:
                log.exception("%s: decoder step failed for %d sentences", self.model, len(decode.sentences))
                failure = EngineFailure(f"{self.model}: decoder step failed: {type(e).__name__}")
                for s in decode.sentences:
                    self._post(self._deliver, running.pop(s.key).pending, failure)
                decode = self._engine.new_decode()
                continue
            self._step_time.observe(time.perf_counter() - start)
            if finished:
                self._answer([(running.pop(s.key), s.results()) for s in finished])

    def _take_inbox(self) -> list[Pending]:
        with self._lock:
            taken, self._inbox = self._inbox, []
            self._work.clear()
        return taken

    def _prepare(self, batch: list[Pending]) -> list[_Sentence]:
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
        prepared = [_Sentence(batch[i], source) for i, source in todo.items()]
        return sorted(prepared, key=lambda s: s.pending.enqueued)

    def _admit_waiting(
        self, decode: RunningDecode, waiting: list[_Sentence], running: dict[int, _Sentence], keys: Any
    ) -> int | None:
        """Move the oldest waiting sentences that fit into the decode; → how many (None: none
        fits although some wait)."""
        budget = self.budget
        chosen: list[_Sentence] = []
        extra: list[tuple[Any, int]] = []
        tokens = 0
        rows = decode.rows
        while waiting and decode.can_admit():
            sentence = waiting[0]
            item, n = sentence.pending.item, sentence.source.n_tokens
            k = item.options.beam_size
            alone = k * decode.shape.row_bytes(decode.limit(item.options), n)
            if item.abandoned.is_set() or alone > budget.memory_bytes:
                waiting.pop(0)
                self._post(self._admitted_from_inbox, 1)
                self._post(self._deliver, sentence.pending, self._refusal(item, alone))
                continue
            fits = decode.worst_bytes([*extra, (item.options, n)]) <= budget.memory_bytes
            if chosen and (not fits or rows + k > budget.max_rows or tokens + n > budget.admit_tokens):
                break
            if not chosen and (not fits or rows + k > budget.max_rows) and decode.sentences:
                break  # the oldest waits for rows to free (no overtaking: no starvation)
            chosen.append(waiting.pop(0))
            extra.append((item.options, n))
            tokens += n
            rows += k
        if not chosen:
            return None if waiting else 0
        self._post(self._admitted_from_inbox, len(chosen))
        entries = []
        for sentence in chosen:
            key = next(keys)
            running[key] = sentence
            entries.append((key, sentence.source, sentence.pending.item.options))
        try:
            done = decode.admit(entries)
        except Exception as e:  # the encoder failed for these: they fail, the running ones go on
            log.exception("%s: encoder failed for %d sentences", self.model, len(chosen))
            failure = EngineFailure(f"{self.model}: encoder failed: {type(e).__name__}")
            for key, _, _ in entries:
                self._post(self._deliver, running.pop(key).pending, failure)
            return len(chosen)
        self._admitted.observe(len(chosen))
        if done:
            self._answer([(running.pop(s.key), s.results()) for s in done])
        return len(chosen)

    def _refusal(self, item: TranslateItem, need: int) -> Exception:
        if item.abandoned.is_set():
            return Abandoned("nobody waits any more")
        o = item.options
        return DecodeTooLarge(
            f"beam_size {o.beam_size} × max_length {o.max_length} needs {need / 2**20:.0f} MiB of decoder "
            f"cache, more than the decode memory budget of {self.budget.memory_bytes / 2**20:.0f} MiB: "
            "lower beam_size or max_length",
            self.budget.memory_bytes,
        )

    def _answer(self, done: list[tuple[_Sentence, list[Hypothesis]]]) -> None:
        """Detokenize finished sentences and answer their requests."""
        items = [s.pending.item for s, _ in done]
        todo = {i: s.source for i, (s, _) in enumerate(done)}
        hyps = {i: found for i, (_, found) in enumerate(done)}
        results: list[Translation | Exception | None] = [None] * len(done)
        try:
            self._engine.finish(items, todo, hyps, results)
        except Exception as e:
            results = [e] * len(done)
        for (sentence, _), result in zip(done, results, strict=True):
            assert result is not None
            self._post(self._deliver, sentence.pending, result)

    def _show(self, decode: RunningDecode) -> None:
        self._running_gauge.set(len(decode.sentences))
        free = self.budget.memory_bytes - decode.worst_bytes()
        widest = decode.shape.row_bytes(decode.shape.max_target_len, max(decode.decoder.source_len, 1))
        self._free_gauge.set(max(0, min(free // widest, self.budget.max_rows - decode.rows)))

    def _fail_all(self, sentences: list[_Sentence], *pending: Pending) -> None:
        closed = BatcherClosed(f"{self.model}: shutting down")
        for p in [*(s.pending for s in sentences), *pending]:
            self._post(self._deliver, p, closed)
