"""Which waiting sentences a worker's running decode admits between two of its steps
(``continuous.py``).

Sentences are admitted oldest first, each request's oldest before any request's second
(``fair``), none overtaking an earlier one of its class (small or not), while the decode's
worst-case memory stays within its share of the budget, the rows of all decodes within
``DecodeBudget.max_rows`` and the sentences encoded in one pause within ``admit_tokens``. They
are dealt out to the least busy worker thread that has room; the express worker takes only
what the worker threads leave it (``left_to_others``). No threads here: the executor calls
``choose`` under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.engine.base import TranslateItem, Translation
from service.engine.tokenizer import Encoded
from service.engine.translation.running import RunningDecode
from service.queue.express import Worker
from service.queue.forming import Pending, round_robin

SentencePending = Pending[TranslateItem, Translation | Exception]
# The express worker takes a small request's sentence only when no worker thread with room for it
# runs fewer rows than this (a step of 64 rows of the default model is short): a third decode
# stepping on two cores slowed every step.
EXPRESS_ABOVE_ROWS = 64


@dataclass(frozen=True)
class DecodeBudget:
    memory_bytes: int  # worst-case cache + memory of the running rows
    max_rows: int  # sentences × beams at once
    admit_tokens: int  # source tokens encoded in one pause between two steps


@dataclass
class Sentence:
    pending: SentencePending
    source: Encoded
    alone: int  # bytes its beams take at its length limit: what it needs of a decode's share


@dataclass
class DecodeWorker:
    """A worker's running decode, driven by the worker's own thread, and the share of the memory
    budget it may take.

    ``rows`` and ``free`` are what the other workers may read of it (published by its own
    thread; the decode itself is touched by its thread only)."""

    worker: Worker
    decode: RunningDecode
    share: int  # bytes
    running: dict[int, Sentence] = field(default_factory=dict)  # by search key
    rows: int = 0
    free: int = 0  # more rows of the widest kind that would fit its share

    @property
    def express(self) -> bool:
        return self.worker.express

    def takes(self, sentence: Sentence) -> bool:
        """Whether the sentence is of this worker's class and could run here, alone at least."""
        return self.worker.takes(sentence.pending) and sentence.alone <= self.share

    def has_room(self, sentence: Sentence) -> bool:
        """Whether it takes the sentence and has room for its beams now (as last published)."""
        return self.takes(sentence) and self.free >= sentence.pending.item.options.beam_size

    def fits(self, chosen: list[Sentence], sentence: Sentence) -> bool:
        """Whether its decode's worst case stays within its share with ``chosen`` and ``sentence``."""
        extra = [(s.pending.item.options, s.source.n_tokens) for s in [*chosen, sentence]]
        return self.decode.worst_bytes(extra) <= self.share


@dataclass
class Choice:
    chosen: list[Sentence]  # for this worker's decode, in admission order
    abandoned: list[Sentence]  # nobody waits for these any more
    # another worker should look: some were dealt to one, or a small one waits for room here
    for_others: bool


def left_to_others(worker: DecodeWorker, sentence: Sentence, workers: list[DecodeWorker]) -> bool:
    """The express worker leaves a sentence to the worker threads while one has room for it and
    runs few enough rows to step about as fast."""
    return worker.express and any(
        o.has_room(sentence) and o.rows < EXPRESS_ABOVE_ROWS for o in workers if not o.express
    )


def choose(
    worker: DecodeWorker, workers: list[DecodeWorker], waiting: list[Sentence], budget: DecodeBudget
) -> Choice:
    """Take out of ``waiting`` (in ``fair`` order) those ``worker`` admits now, and those nobody
    waits for. They are dealt out in turn: one goes to another worker thread that takes it when
    that one runs fewer rows than this one (counting what this pass dealt to each) and has room
    for it; that worker's own thread admits it."""
    others = [other for other in workers if other is not worker and not other.express]
    load = {id(other): other.rows for other in others}  # their rows, and what this pass dealt them
    room = {id(other): other.free for other in others}
    chosen: list[Sentence] = []
    abandoned: list[Sentence] = []
    rows = sum(other.rows for other in workers if other is not worker) + worker.decode.rows
    tokens = 0
    blocked: set[bool] = set()  # classes (small or not) whose earlier sentence waits for room
    dealt = False
    for sentence in list(waiting):
        item, small = sentence.pending.item, sentence.pending.small
        if item.abandoned.is_set():
            waiting.remove(sentence)
            abandoned.append(sentence)
            continue
        if not worker.takes(sentence) or small in blocked or left_to_others(worker, sentence, workers):
            continue
        k, n = item.options.beam_size, sentence.source.n_tokens
        if worker.running or chosen:
            mine = worker.rows + sum(s.pending.item.options.beam_size for s in chosen)
            idle = [o for o in others if o.takes(sentence) and load[id(o)] < mine and room[id(o)] >= k]
            if idle:  # the least busy worker takes it
                other = min(idle, key=lambda o: load[id(o)])
                load[id(other)] += k
                room[id(other)] -= k
                dealt = True
                continue
            fits = worker.decode.can_admit() and worker.fits(chosen, sentence)
            if not fits or rows + k > budget.max_rows:
                blocked.add(small)  # it waits for rows to free; none of its class overtakes
                continue
        if tokens and tokens + n > budget.admit_tokens:
            break
        waiting.remove(sentence)
        chosen.append(sentence)
        rows += k
        tokens += n
    return Choice(chosen, abandoned, dealt or (True in blocked and not worker.express))


def fair(waiting: list[Sentence]) -> list[Sentence]:
    """Admission order: ``round_robin`` over the requests, oldest first."""
    return round_robin(sorted(waiting, key=lambda s: s.pending.enqueued), lambda s: s.pending.request)
