"""Greedy and beam search over any incremental decoder, in NumPy.

The search owns the hypotheses; the decoder owns its key/value cache. Each step the decoder
gets the last token of every running row and returns next-token log-probabilities; ``reorder``
tells it which rows survive and in what order (beams that win are copied, finished sentences
leave the running batch). The ONNX engine and the PyTorch reference both plug in here, so
their outputs can be compared token for token.

Each sentence is a ``SentenceSearch`` (sentence_search.py) holding a block of ``beam_size``
consecutive rows, with its own beam size, n-best, length penalty and length limit; a ``Search``
steps any set of them together, and sentences may join it between steps (iteration-level
batching, where the decoder supports it: ``service/queue/continuous.py``). A sentence's result
depends only on its own rows' scores, never on the other sentences of the step.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence

import numpy as np

from service.engine.translation import beam_step
from service.engine.translation.beam_step import (
    EARLY_NEVER,
    FreeSentences,
    Ranked,
    StepOutcome,
    block_order,
    widened,
)
from service.engine.translation.candidates import Candidates
from service.engine.translation.ranking import best_candidates, best_continuations, best_listed
from service.engine.translation.sentence_search import SentenceSearch, TokenHypothesis
from service.engine.translation.step_records import StepRecords, offered_traces


class Search:
    """The sentences decoding together, in row order: sentence j holds rows
    [offset_j, offset_j + k_j) of the decoder's running batch.

    Its state is arrays over the sentences and over the rows, so that a step of the free ones
    (no required phrases: the common case; alignments are traced back as they finish,
    ``step_records.py``) is array operations over all of them (``beam_step.py``); the others,
    and every sentence of a search of ``FEW_SENTENCES``, step through their own ``SentenceSearch``.
    """

    def __init__(self, bos_id: int, eos_id: int) -> None:
        self.bos_id = bos_id
        self.eos_id = eos_id
        self._sentences = np.empty(0, dtype=object)  # the running SentenceSearch, in row order
        self._k = np.zeros(0, dtype=np.int64)
        self._steps = np.zeros(0, dtype=np.int64)  # tokens generated (free sentences)
        self._max_len = np.zeros(0, dtype=np.int64)
        self._length_penalty = np.zeros(0)
        self._early = np.zeros(0, dtype=np.int64)
        self._forced = np.zeros(0, dtype=np.int64)  # the forced first token, -1: none
        self._free = np.zeros(0, dtype=bool)  # stepped by ``beam_step`` (else by its SentenceSearch)
        self._wants = np.zeros(0, dtype=bool)  # may need log-probs of given tokens (``wanted``)
        self._attention = np.zeros(0, dtype=bool)
        self._finished = np.zeros((0, 1))  # free sentences' finished scores, best first, -inf: none
        self._finished_tokens = np.empty((0, 1), dtype=object)  # … and their token lists
        self._finished_traces = np.empty((0, 1), dtype=object)  # … (alignment, log-probs) if kept
        self._records = StepRecords()  # the steps' attention, for free sentences keeping it
        self._scores = np.zeros(0)  # per row: the running log-prob
        self._last = np.zeros(0, dtype=np.int64)  # per row: its last token (<s> before the first)
        self._history = np.zeros((0, 16), dtype=np.int32)  # per row: a free sentence's tokens
        self._laid_out()

    def _laid_out(self) -> None:
        """What the step reads of the sentences' order, worked out again when it changes."""
        self._offsets = np.cumsum(self._k) - self._k  # each sentence's first row
        self._beams = np.unique(self._k).tolist()
        self._free_rows = np.repeat(self._free, self._k)
        self._all_free = bool(self._free.all())
        # read every step: worked out here rather than over the arrays each time
        self._widest = int(self._k.max(initial=0))
        self._attending = bool(self._attention.any())
        self._wanting = bool(self._wants.any())
        self._recording = bool((self._free & self._attention).any())

    @property
    def sentences(self) -> list[SentenceSearch]:
        return list(self._sentences)

    @property
    def running(self) -> int:
        """How many sentences run."""
        return len(self._sentences)

    @property
    def with_attention(self) -> bool:
        return self._attending

    @property
    def widest_beam(self) -> int:
        return self._widest

    def first_rows(self) -> dict[SentenceSearch, int]:
        """Each running sentence's first row, as the decoder's rows lie until the next reorder."""
        return dict(zip(self._sentences.tolist(), self._offsets.tolist(), strict=True))

    def extend(self, sentences: Sequence[SentenceSearch], own: Container[SentenceSearch] = ()) -> None:
        """New sentences' rows go after the running ones (the decoder appends them alike); those
        in ``own`` step through their own search (``SentenceSearch.ended_on`` is read each step)."""
        if not sentences:
            return
        new = np.empty(len(sentences), dtype=object)
        new[:] = sentences
        k = np.array([s.k for s in sentences], dtype=np.int64)
        many = len(self._k) + len(sentences) > FEW_SENTENCES
        free = np.array([many and steps_in_batch(s) and s not in own for s in sentences], dtype=bool)
        early = [EARLY_NEVER if s.early_stopping == "never" else int(not s.early_stopping) for s in sentences]
        forced = [-1 if s.forced_first is None else s.forced_first for s in sentences]
        self._sentences = np.concatenate([self._sentences, new])
        self._k = np.concatenate([self._k, k])
        self._steps = np.concatenate([self._steps, np.zeros(len(new), dtype=np.int64)])
        self._max_len = np.concatenate([self._max_len, [s.max_len for s in sentences]])
        self._length_penalty = np.concatenate([self._length_penalty, [s.length_penalty for s in sentences]])
        self._early = np.concatenate([self._early, early])
        self._forced = np.concatenate([self._forced, forced])
        self._free = np.concatenate([self._free, free])
        self._wants = np.concatenate([self._wants, [s.wants_tokens for s in sentences]])
        self._attention = np.concatenate([self._attention, [s.with_attention for s in sentences]])
        width = max(self._finished.shape[1], int(k.max()))
        self._finished = np.concatenate(
            [widened(self._finished, width, -np.inf), np.full((len(new), width), -np.inf)]
        )
        empty = np.empty((len(new), width), dtype=object)
        self._finished_tokens = np.concatenate([widened(self._finished_tokens, width, None), empty])
        self._finished_traces = np.concatenate([widened(self._finished_traces, width, None), empty])
        scores = np.concatenate([s.scores for s in sentences])  # a resumed search's are its own
        self._scores = np.concatenate([self._scores, scores])
        last = np.concatenate([s.last_tokens(self.bos_id) for s in sentences])
        self._last = np.concatenate([self._last, last])
        history = np.zeros((len(scores), self._history.shape[1]), dtype=np.int32)
        self._history = np.concatenate([self._history, history])
        self._laid_out()

    def last_tokens(self) -> np.ndarray:
        return self._last.copy()

    def wanted_tokens(self) -> np.ndarray | None:
        """(rows, m) the tokens whose log-probs the next step must give beside each row's best
        ones (``Candidates.wanted``): the constrained sentences' next constraint tokens and the
        forced prefixes' next tokens, padded with </s>; None when no row wants any."""
        if not self._wanting:
            return None
        rows = [tokens for s in self._sentences for tokens in s.wanted()]
        width = max(map(len, rows))
        if not width:
            return None
        wanted = np.full((len(rows), width), self.eos_id, dtype=np.int64)
        for row, tokens in zip(wanted, rows, strict=True):
            row[: len(tokens)] = tokens
        return wanted

    def remove(self, gone: Callable[[SentenceSearch], bool]) -> np.ndarray:
        """Drop the sentences ``gone`` flags; → the rows to keep."""
        leaving = np.array([gone(s) for s in self._sentences], dtype=bool)
        for j in np.flatnonzero(leaving & self._free).tolist():  # they leave with what they have
            self._hand_over(j)
        return self._settle(leaving, np.arange(len(self._scores)), None)

    def advance(
        self, log_probs: np.ndarray | Candidates, attention: np.ndarray | None
    ) -> tuple[np.ndarray, list[SentenceSearch]]:
        """One step's scores for every row → the rows to keep, in order, and the sentences that
        finished (no longer in ``sentences``). Sentences of one beam size are ranked together."""
        offsets = self._offsets
        if self._recording:
            self._records.begin(attention, self._scores)
        done = np.zeros(len(self._k), dtype=bool)
        parents = np.arange(len(self._scores))  # each row's new parent row
        tokens = np.zeros(len(self._scores), dtype=np.int64)
        resized: dict[int, np.ndarray] = {}  # sentences whose rows change in number: their parents
        for k in self._beams:
            if self._all_free and len(self._beams) == 1:  # the common case: every row, as they lie
                self._step_free(
                    slice(None), k, self._ranked(log_probs, slice(None), k), (done, parents, tokens)
                )
                continue
            members = np.flatnonzero(self._k == k)
            free = self._free[members]
            if isinstance(log_probs, Candidates) and not free.any():
                ranked: Ranked | Candidates = log_probs  # own searches alone: Python ranks their few
            else:
                ranked = self._ranked(log_probs, members, k)
            if isinstance(ranked, Ranked) and free.any():
                self._step_free(members[free], k, ranked.part(free), (done, parents, tokens))
            for i in np.flatnonzero(~free).tolist():
                j, start = int(members[i]), int(offsets[members[i]])
                if isinstance(ranked, Ranked):
                    best = ranked.listed(i)
                else:
                    best = best_listed(self._scores, ranked.log_probs, ranked.tokens, start, k)
                kept = self._step_own(j, best, start, log_probs, attention)
                done[j] = kept is None
                if kept is not None and len(kept) == k:
                    parents[offsets[j] : offsets[j] + k] = kept + offsets[j]
                elif kept is not None:
                    resized[j] = kept + offsets[j]
        if resized:
            parents, tokens = self._resized(resized, parents, tokens)
        finished = self._sentences[done].tolist()
        return self._settle(done, parents, tokens), finished

    def _resized(
        self, resized: dict[int, np.ndarray], parents: np.ndarray, tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The layout once ``resized`` sentences take as many rows as their parents say (a forced
        prefix ending: one row becomes a beam): the step's parents and tokens, and the rows'
        scores, each where its row lies now."""
        parts, places = [], []
        for j, (start, k) in enumerate(zip(self._offsets.tolist(), self._k.tolist(), strict=True)):
            rows = resized.get(j)
            parts.append(parents[start : start + k] if rows is None else rows)
            places.append(np.arange(start, start + k) if rows is None else np.full(len(rows), start))
            if rows is not None:
                self._k[j] = len(rows)
        place = np.concatenate(places)
        self._scores = self._scores[place]  # an own search's rows get theirs from it (``_settle``)
        self._laid_out()
        return np.concatenate(parts), tokens[place]

    def _ranked(self, log_probs: np.ndarray | Candidates, members: Members, k: int) -> Ranked:
        """The ``members``' (all of beam ``k``) 2·k best continuations each, rows within their block."""
        every = isinstance(members, slice) or len(members) == len(self._k)  # every row, in order
        rows = slice(None) if every else (self._offsets[members][:, None] + np.arange(k)).reshape(-1)
        scores = self._scores[rows]
        if isinstance(log_probs, Candidates):
            width = min(2 * k, log_probs.log_probs.shape[1])
            group = log_probs.log_probs[rows, :width], log_probs.tokens[rows, :width]
            top = best_candidates(scores, *group, k, 2 * k)
        else:
            top = best_continuations(scores, log_probs[rows], k, 2 * k)
        return Ranked(*top)

    def _step_free(self, members: Members, k: int, ranked: Ranked, out: _StepRows) -> None:
        """``beam_step.step`` for the free ``members`` (of beam ``k``): the finished hypotheses
        kept, the done ones' results handed to their ``SentenceSearch``, each running row's
        parent, token and score written into ``out`` (done, parents, tokens) and the arrays."""
        starts, steps = self._offsets[members], self._steps[members]
        forced = (steps == 0) & (self._forced[members] >= 0)
        if forced.any():  # the first step's one continuation: the forced token, scored 0
            ranked.rows[forced], ranked.tokens[forced, 0] = 0, self._forced[members][forced]
            ranked.scores[forced] = -np.inf
            ranked.scores[forced, 0] = self._scores[starts[forced]]
        state = FreeSentences(
            k,
            steps,
            self._max_len[members],
            self._length_penalty[members],
            self._early[members],
            self._finished[members, :k],
        )
        outcome = beam_step.step(state, ranked, self.eos_id)
        if outcome.finishing is not None:
            self._keep_finished(members, starts, outcome, k)
        done, parents, tokens = out
        done[members] = outcome.done
        going = ~outcome.done
        every = isinstance(members, slice) and going.all()  # every row, in order: no row to pick
        rows = slice(None) if every else (starts[:, None] + np.arange(k))[going].reshape(-1)
        picked = slice(None) if every else going
        parents[rows] = (starts[:, None] + outcome.parents)[picked].reshape(-1)
        tokens[rows] = outcome.tokens[picked].reshape(-1)
        self._scores[rows] = outcome.scores[picked].reshape(-1)
        self._steps[members] += going
        if not going.all():
            for j in np.arange(len(self._k))[members][outcome.done].tolist():
                self._hand_over(j)
                self._sentences[j].done = True

    def _keep_finished(self, members: Members, starts: np.ndarray, outcome: StepOutcome, k: int) -> None:
        """The step's finished hypotheses' tokens (read from the rows' history), and those of
        sentences keeping alignments their alignment and token log-probs (``step_records``), kept
        in the ``k`` best of each sentence as ``outcome`` ranked them."""
        f, order = outcome.finishing, outcome.order
        assert f is not None and order is not None
        offered = np.empty((len(starts), k), dtype=object)
        steps, skip = self._steps[members][f.sentence], (self._forced[members] >= 0)[f.sentence]
        histories = self._history[starts[f.sentence] + f.row, : int(steps.max())].tolist()  # one read
        ends = [[t] if added else [] for t, added in zip(f.token.tolist(), f.appended.tolist(), strict=True)]
        places = zip(f.sentence.tolist(), f.column.tolist(), steps.tolist(), skip.tolist(), strict=True)
        for (i, column, n, first), history, end in zip(places, histories, ends, strict=True):
            offered[i, column] = (history[:n] + end)[first:]
        self._finished_tokens[members, :k] = _pooled(self._finished_tokens[members, :k], offered, order)
        self._finished[members, :k] = outcome.finished
        traced = self._attention[members][f.sentence] if self._recording else None
        if traced is not None and traced.any():
            widths = [s.source_len for s in self._sentences[members][f.sentence[traced]].tolist()]
            rows = starts[f.sentence] + f.row
            offered = offered_traces(self._records, f, traced, rows, steps, skip, widths, offered.shape)
            self._finished_traces[members, :k] = _pooled(self._finished_traces[members, :k], offered, order)

    def _hand_over(self, j: int) -> None:
        """A free sentence's finished hypotheses become its ``SentenceSearch``'s (it leaves)."""
        s = self._sentences[j]
        kept = zip(
            self._finished_tokens[j], self._finished[j].tolist(), self._finished_traces[j], strict=True
        )
        s.finished = [
            TokenHypothesis(tokens, float(score), *(traced or (None, None)))
            for tokens, score, traced in kept
            if score != -np.inf
        ]

    def _step_own(
        self,
        j: int,
        ranked: list[tuple[int, int, float]],
        start: int,
        log_probs: np.ndarray | Candidates,
        attention: np.ndarray | None,
    ) -> np.ndarray | None:
        """A constrained sentence's, a placing one's free search, or one of few: its
        ``SentenceSearch`` steps it from its ``ranked`` continuations."""
        s: SentenceSearch = self._sentences[j]
        block = None
        if attention is not None and s.with_attention:
            block = attention[start : start + s.k, : s.source_len]
        best = s.after_prefix(start, log_probs) if s.at_prefix_end else ranked
        continuations = s.forced(start, log_probs) or [*best, *s.constraint_continuations(start, log_probs)]
        return s.advance(continuations, block, self.eos_id)

    def _settle(self, leaving: np.ndarray, parents: np.ndarray, tokens: np.ndarray | None) -> np.ndarray:
        """The running sentences' new order and rows once ``leaving`` ones leave: a block that
        leaves is filled by the last running block of the same size, so the decoder moves that
        one block instead of shifting every later one. Row i of the old order becomes a child of
        ``parents[i]`` with ``tokens[i]`` (None: no step, the rows only move); → the rows the
        decoder keeps, in order."""
        rows: np.ndarray = parents
        if leaving.any():
            order = block_order(self._k, leaving)
            k = self._k[order]
            row_idx = np.repeat(self._offsets[order] - (np.cumsum(k) - k), k) + np.arange(int(k.sum()))
            rows = parents[row_idx]
            for name in _PER_SENTENCE:
                setattr(self, name, getattr(self, name)[order])
            self._scores = self._scores[row_idx]
            tokens = None if tokens is None else tokens[row_idx]
            self._laid_out()
        self._last = self._last[rows]
        if self._free.any():
            self._history = self._history[rows]
            if tokens is not None:
                self._write(tokens)
        elif len(self._history) != len(rows):  # only rows of their own searches: no history to keep
            self._history = np.zeros((len(rows), self._history.shape[1]), dtype=np.int32)
        for j in np.flatnonzero(~self._free).tolist():  # their own search holds their rows' state
            s, start = self._sentences[j], self._offsets[j]
            self._scores[start : start + s.k] = s.scores
            self._last[start : start + s.k] = s.last_tokens(self.bos_id)
        if self._recording and self._records.begun:
            self._records.end(rows, int(self._steps[self._free & self._attention].max()))
        elif self._recording:  # a move between steps
            self._records.moved(rows, len(parents))
        elif self._records.held:  # the last sentence keeping alignments has left
            self._records.clear()
        return rows

    def _write(self, tokens: np.ndarray) -> None:
        """Each free row's new token, after its history (in the new order)."""
        free = self._free_rows
        column = np.repeat(self._steps, self._k) - 1
        if len(column) and column.max() >= self._history.shape[1]:
            self._history = widened(self._history, 2 * self._history.shape[1], 0)
        if self._all_free:
            self._history[np.arange(len(column)), column] = tokens
            self._last = tokens
        else:
            self._history[np.flatnonzero(free), column[free]] = tokens[free]
            self._last[free] = tokens[free]


def _pooled(kept: np.ndarray, offered: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each sentence's kept and offered entries, as ``order`` picks them (``beam_step._finish``)."""
    pool = np.concatenate([kept, offered], axis=1)
    picked: np.ndarray = pool[np.arange(len(pool))[:, None], order]
    return picked


# A search of at most this many sentences steps newcomers through their own ``SentenceSearch``:
# below it NumPy's cost per call outweighs the loop it saves (one sentence at beam 4, a step of
# the search: 68 µs in Python, 162 µs as arrays, on the 2-core reference machine).
FEW_SENTENCES = 2


def steps_in_batch(s: SentenceSearch) -> bool:
    """Whether ``beam_step`` steps the sentence with the other free ones: no required phrases and
    no forced prefix (those step through their own ``SentenceSearch``)."""
    return not s.wants_tokens


# the arrays over the sentences, in row order: reordered together (``_settle``)
_PER_SENTENCE = ["_sentences", "_k", "_steps", "_max_len", "_length_penalty", "_early", "_forced"]
_PER_SENTENCE += ["_free", "_wants", "_attention", "_finished", "_finished_tokens", "_finished_traces"]
Members = np.ndarray | slice  # some sentences' indices, or slice(None): all of them
_StepRows = tuple[np.ndarray, np.ndarray, np.ndarray]  # done (sentences,), parents and tokens (rows,)
