"""Iteration-level ("continuous") execution for translation: sentences join and leave the running
decode between any two decoder steps.

The whole-batch executor decodes a batch to the end and only then starts the next, so a short
sentence that arrives while long ones decode waits for all of them. ``ContinuousExecutor`` runs
the same request queue (bound → 429, deadlines → 504, disconnects, fair order, drain) with a
``RunningDecode`` (``service/engine/translation/running.py``) per worker, each driven by the worker's own
thread: ``BatchPolicy.worker_threads`` of them, and with ``BatchPolicy.express_max_tokens`` the
express worker (``express.py``) with a quarter of the memory budget, which takes small requests'
sentences when the worker threads are full or busy, so a one-word request is never held behind
long ones. Between two steps of its decode a worker's thread

* prepares (tokenizes) what the event loop handed over, answering at once what fails or could
  never fit, even alone (``DecodeTooLarge`` → 422);
* admits waiting sentences (``admission.py``), oldest first (each request's oldest before any
  request's second), while its decode's worst-case memory (every row at its own length limit
  and the longest source: ``RunningDecode.worst_bytes``) stays within its share of
  ``DecodeBudget.memory_bytes``, the rows of all workers within ``max_rows`` and the sentences
  encoded in one pause within ``admit_tokens`` (so encoding never stalls the decode for long);
  the sentences are dealt out to the less busy worker threads (a many-sentence request runs on
  every one); the express worker takes a small request's sentence only when no worker thread
  that has room for it runs few rows (``admission.EXPRESS_ABOVE_ROWS``);
* takes out the sentences nobody waits for any more (client gone, deadline passed: the queue
  sets ``TranslateItem.abandoned``), freeing their rows at once;
* runs one step over every running row and answers the step's finished sentences at once.

The worker threads run side by side: one's Python search overlaps another's onnxruntime step. A
step that raises fails the sentences in it (``EngineFailure`` → 500); the sentences still
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
from collections.abc import Iterable
from typing import Any

from service.engine.base import Abandoned, TranslateItem, Translation
from service.engine.translation.running import ContinuousEngine
from service.engine.translation.sentence_search import TokenHypothesis
from service.metrics import ADMITTED_PER_STEP, DECODE_FREE_ROWS, DECODE_RUNNING, DECODE_STEP, ITEM_ERRORS
from service.queue.admission import (
    DecodeBudget,
    DecodeWorker,
    Sentence,
    SentencePending,
    choose,
    fair,
    left_to_others,
)
from service.queue.errors import EngineFailure, QueueClosed
from service.queue.express import workers
from service.queue.requests import RequestQueue

log = logging.getLogger(__name__)

TranslationQueue = RequestQueue[TranslateItem, Translation | Exception]
EXPRESS_SHARE = 0.25  # of the decode memory budget, only for sentences of small requests


class DecodeTooLarge(ValueError):
    """A sentence whose beams at its length limit exceed the decode memory budget on their own:
    it could never be admitted (→ 422 naming the limit)."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit  # the budget, in bytes


class ContinuousExecutor:
    """A translation model's iteration-level decoding: a running decode per worker thread."""

    def __init__(self, engine: ContinuousEngine, budget: DecodeBudget) -> None:
        self._engine = engine
        self.budget = budget
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the inbox or the waiting sentences changed
        self._inbox: list[SentencePending] = []  # handed over by the event loop, not yet prepared
        self._waiting: list[Sentence] = []  # prepared, not admitted yet, in ``fair`` order
        self._closing = False
        self._staged = 0  # items handed over and not yet admitted (event-loop side)
        self._keys = itertools.count()
        self._workers: list[DecodeWorker] = []
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._queue: TranslationQueue | None = None
        self._model = engine.name
        self._running_gauge = DECODE_RUNNING.labels(model=self._model)
        self._free_gauge = DECODE_FREE_ROWS.labels(model=self._model)
        self._step_time = DECODE_STEP.labels(model=self._model)
        self._admitted = ADMITTED_PER_STEP.labels(model=self._model)
        self._errors = ITEM_ERRORS.labels(model=self._model)

    # ---- the event-loop side ------------------------------------------------------------------

    async def run(self, queue: TranslationQueue) -> None:
        self._event_loop, self._queue = asyncio.get_running_loop(), queue
        self._workers = self._new_workers(queue)
        for worker in self._workers:
            self._show(worker)
            threading.Thread(target=self._drive, args=(worker,), name=worker.worker.name, daemon=True).start()
        try:
            while True:
                queue.purge()
                if queue.queued and self._staged < queue.policy.max_batch_size:
                    self._hand_over(queue.take_batch())
                    continue
                if queue.queued and (small := queue.take_small()):  # not held behind staged ones
                    self._hand_over(small)
                    continue
                await queue.wait()
        finally:
            self._stop_threads()

    def abandon(self, item: TranslateItem) -> bool:
        item.abandoned.set()  # its worker drops it before its next step
        return True

    async def close(self) -> None:
        self._stop_threads()

    def _hand_over(self, batch: list[SentencePending]) -> None:
        self._staged += len(batch)
        with self._work:
            self._inbox.extend(batch)
            self._work.notify_all()

    def _deliver(self, pending: SentencePending, result: Translation | Exception) -> None:
        """On the event loop: one sentence's result (or error) to its request."""
        if isinstance(result, Exception) and not isinstance(result, Abandoned):
            self._errors.inc()
        assert self._queue is not None
        self._queue.deliver(pending, result)

    def _deliver_all(self, answers: list[tuple[SentencePending, Translation | Exception]]) -> None:
        """On the event loop: the results of a step's finished sentences (one hand-off a step)."""
        for pending, result in answers:
            self._deliver(pending, result)

    def _admitted_from_inbox(self, n: int) -> None:
        self._staged -= n
        assert self._queue is not None
        self._queue.wake()

    def _post(self, callback: Any, *args: Any) -> None:
        """Run ``callback`` on the event loop (from a worker thread)."""
        assert self._event_loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._event_loop.call_soon_threadsafe(callback, *args)

    def _stop_threads(self) -> None:
        with self._work:
            self._closing = True
            self._work.notify_all()

    # ---- the worker threads -------------------------------------------------------------------

    def _new_workers(self, queue: TranslationQueue) -> list[DecodeWorker]:
        """The worker threads' decodes sharing the budget equally, and with express requests on
        (``BatchPolicy.express_max_tokens``) the express worker's decode with ``EXPRESS_SHARE``
        of it: a one-word request then finds room within a step or two however long the other
        decodes' sentences run, and its short limit does not pad theirs (each decode's cache has
        its own width)."""
        total = self.budget.memory_bytes
        express = int(total * EXPRESS_SHARE) if queue.policy.express_max_tokens else 0
        per_thread = (total - express) // queue.policy.worker_threads
        return [
            DecodeWorker(w, self._engine.new_decode(), express if w.express else per_thread)
            for w in workers("decode", queue.model, queue.policy)
        ]

    def _drive(self, worker: DecodeWorker) -> None:
        """A worker's thread: between two steps of its decode, prepare what was handed over,
        admit what fits, drop what nobody waits for; then step. The workers run side by side
        (one's Python search overlaps another's onnxruntime step, which releases the GIL)."""
        while True:
            with self._work:
                while not (self._closing or worker.running or self._inbox or self._work_for(worker)):
                    self._work.wait()
                if self._closing:
                    break
                batch, self._inbox = self._inbox, []
            held: list[Sentence] = []  # prepared here, not yet among the waiting
            try:
                held = self._prepare(batch)
                self._admit_waiting(worker, held)
                held = []
                self._drop_abandoned(worker)
                if worker.running:
                    self._step(worker)
                self._show(worker)
            except Exception:  # a bug, not a model failure: fail what is in flight, serve on
                log.exception("%s: the decode loop failed", self._model)
                failure = EngineFailure(f"{self._model}: decoding failed")
                self._fail(failure, [*held, *worker.running.values()])
                self._post(self._admitted_from_inbox, len(held))
                self._reset(worker)
        with self._work:
            closed = QueueClosed(f"{self._model}: shutting down")
            self._fail(closed, [*worker.running.values(), *self._waiting])
            for pending in self._inbox:
                self._post(self._deliver, pending, closed)
            self._post(self._admitted_from_inbox, len(self._waiting) + len(self._inbox))
            self._waiting, self._inbox = [], []

    def _work_for(self, worker: DecodeWorker) -> bool:
        return any(
            (worker.takes(s) and not left_to_others(worker, s, self._workers))
            or s.pending.item.abandoned.is_set()
            for s in self._waiting
        )

    def _prepare(self, batch: list[SentencePending]) -> list[Sentence]:
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
        shape, limit = self._workers[0].decode.shape, self._workers[0].decode.limit
        for i, (pending, result) in enumerate(zip(batch, results, strict=True)):
            if i not in todo:
                assert result is not None
                self._post(self._deliver, pending, result)
                continue
            options, n = pending.item.options, todo[i].n_tokens
            sentence = Sentence(pending, todo[i], shape.footprint(options.beam_size, 1, limit(options), n))
            room = max(w.share for w in self._workers if w.worker.takes(pending))
            if sentence.alone > room:
                self._post(self._deliver, pending, _too_large(pending.item, sentence.alone, room))
                continue
            prepared.append(sentence)
        self._post(self._admitted_from_inbox, len(batch) - len(prepared))
        return prepared

    def _admit_waiting(self, worker: DecodeWorker, prepared: list[Sentence]) -> None:
        """Join ``prepared`` to the waiting sentences, then move those this worker takes into its
        decode, in ``fair`` order, none overtaking an earlier one of its class (small or not)."""
        with self._work:
            self._waiting = fair(self._waiting + prepared)
            choice = choose(worker, self._workers, self._waiting, self.budget)
            if prepared or choice.for_others:
                self._work.notify_all()  # another worker may take some
        if choice.abandoned or choice.chosen:
            self._post(self._admitted_from_inbox, len(choice.abandoned) + len(choice.chosen))
        self._fail(Abandoned("nobody waits any more"), choice.abandoned)
        if choice.chosen:
            self._admitted.observe(len(choice.chosen))
            self._admit_into(worker, choice.chosen)

    def _admit_into(self, worker: DecodeWorker, sentences: list[Sentence]) -> None:
        entries = []
        for sentence in sentences:
            key = next(self._keys)
            worker.running[key] = sentence
            entries.append((key, sentence.source, sentence.pending.item.options))
        try:
            done = worker.decode.admit(entries)
        except Exception as e:  # the encoder failed for these: they fail, the running ones go on
            log.exception("%s: encoder failed for %d sentences", self._model, len(sentences))
            failure = EngineFailure(f"{self._model}: encoder failed: {type(e).__name__}")
            self._fail(failure, [worker.running.pop(key) for key, _, _ in entries])
            return
        if done:
            self._answer([(worker.running.pop(s.key), s.results()) for s in done])

    def _drop_abandoned(self, worker: DecodeWorker) -> None:
        """Sentences nobody waits for any more (client gone, deadline passed) leave now."""
        gone = worker.decode.remove(lambda s: worker.running[s.key].pending.item.abandoned.is_set())
        self._fail(Abandoned("nobody waits any more"), [worker.running.pop(s.key) for s in gone])

    def _step(self, worker: DecodeWorker) -> None:
        start = time.perf_counter()
        try:
            finished = worker.decode.step()
        except Exception as e:
            log.exception("%s: decoder step failed for %d sentences", self._model, len(worker.running))
            failure = EngineFailure(f"{self._model}: decoder step failed: {type(e).__name__}")
            self._fail(failure, worker.running.values())
            self._reset(worker)
            return
        self._step_time.observe(time.perf_counter() - start)
        if finished:
            self._answer([(worker.running.pop(s.key), s.results()) for s in finished])

    def _answer(self, done: list[tuple[Sentence, list[TokenHypothesis]]]) -> None:
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

    def _fail(self, error: Exception, sentences: Iterable[Sentence]) -> None:
        for sentence in list(sentences):
            self._post(self._deliver, sentence.pending, error)

    def _reset(self, worker: DecodeWorker) -> None:
        worker.decode, worker.running = self._engine.new_decode(), {}
        self._show(worker)

    def _show(self, worker: DecodeWorker) -> None:
        """Publish the worker's rows and room (for the other workers and the gauges)."""
        d = worker.decode
        worker.rows = d.rows
        widest = d.shape.footprint(1, 1, d.shape.max_target_len, max(d.decoder.source_len, 1))  # a greedy one
        worker.free = max(0, worker.share - d.worst_bytes()) // widest
        self._running_gauge.set(sum(len(other.running) for other in self._workers))
        free = sum(other.free for other in self._workers)
        self._free_gauge.set(min(free, self.budget.max_rows - sum(other.rows for other in self._workers)))


def _too_large(item: TranslateItem, need: int, room: int) -> DecodeTooLarge:
    o = item.options
    return DecodeTooLarge(
        f"beam_size {o.beam_size} × max_length {o.max_length} needs {need / 2**20:.1f} MiB of decoder "
        f"cache, more than the {room / 2**20:.1f} MiB a sentence may use (TSERVE_DECODE_MEMORY_MB): "
        "lower beam_size or max_length",
        room,
    )
