"""One decoder step of many free beam searches of one beam size, as array operations.

``SentenceSearch.advance`` takes one sentence's step in Python; this is the same rule for every
free sentence of a step at once (``search.Search`` sends the others, constrained ones, through
``SentenceSearch``): of each sentence's 2·k ranked continuations, the k best
that end in </s> (all k best at its length limit) are offered to its finished hypotheses, which
keep the k best by normalised score, the k best others run on, and the sentence stops as its
``EarlyStopping`` rule says. Step for step, token for token and score for score the same as
``SentenceSearch``; nothing in a sentence's rows depends on another sentence's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EARLY_TRUE, EARLY_FALSE, EARLY_NEVER = 0, 1, 2  # ``EarlyStopping``'s meanings, as codes


@dataclass
class Ranked:
    """Each sentence's continuations, best first: its row (within its block), token and score;
    -inf scores pad a sentence that has fewer."""

    rows: np.ndarray  # (n, m) int64
    tokens: np.ndarray  # (n, m) int64
    scores: np.ndarray  # (n, m) float64

    def part(self, which: np.ndarray | slice) -> Ranked:
        return Ranked(self.rows[which], self.tokens[which], self.scores[which])

    def listed(self, i: int) -> list[tuple[int, int, float]]:
        """Sentence ``i``'s continuations as (row, token, score)."""
        rows, tokens, scores = self.rows[i].tolist(), self.tokens[i].tolist(), self.scores[i].tolist()
        return list(zip(rows, tokens, scores, strict=True))


@dataclass
class FreeSentences:
    """What the step reads of n sentences of beam ``k``, gathered from ``Search``'s arrays."""

    k: int
    steps: np.ndarray  # (n,) tokens generated so far
    max_len: np.ndarray  # (n,)
    length_penalty: np.ndarray  # (n,) float64
    early: np.ndarray  # (n,) EARLY_* codes
    finished: np.ndarray  # (n, k) float64: normalised scores of the finished hypotheses, best first


@dataclass
class Finishing:
    """The step's newly finished hypotheses (sentence index, the continuation's column among the
    sentence's ranked ones, its row, token, normalised score, log-prob, whether the token is
    appended: not at </s>), in the order they were offered."""

    sentence: np.ndarray
    column: np.ndarray
    row: np.ndarray
    token: np.ndarray
    score: np.ndarray
    log_prob: np.ndarray
    appended: np.ndarray


@dataclass
class StepOutcome:
    finishing: Finishing | None  # None: no hypothesis finished this step
    finished: np.ndarray  # (n, k) the finished scores after the step, best first
    # (n, k) which of the old finished (0 … k-1) and the finishing (k … 2k-1) each slot holds
    order: np.ndarray | None
    done: np.ndarray  # (n,) bool
    parents: np.ndarray  # (n, k) each new row's parent row, for the sentences not done
    tokens: np.ndarray  # (n, k)
    scores: np.ndarray  # (n, k) float64


def normalised(logprob: np.ndarray, length: np.ndarray, length_penalty: np.ndarray) -> np.ndarray:
    """``sentence_search._normalise`` over arrays."""
    out: np.ndarray = logprob / np.maximum(length, 1).astype(np.float64) ** length_penalty
    return out


def step(s: FreeSentences, ranked: Ranked, eos_id: int) -> StepOutcome:
    """One step of every sentence in ``s`` from its ranked continuations."""
    k, n = s.k, len(s.steps)
    sentence = np.arange(n)[:, None]
    at_limit = s.steps >= s.max_len - 1
    eos = ranked.tokens == eos_id
    live = ranked.scores != -np.inf
    ends = (eos[:, :k] | at_limit[:, None]) & live[:, :k]
    finishing, finished, order = _finish(s, ranked, ends, eos_id) if ends.any() else (None, s.finished, None)
    # the k best continuations that run on, padded with the last one at -inf
    runs = ~eos & live
    runs[at_limit] = False
    count = runs.sum(axis=1)
    take = np.argsort(~runs, axis=1, kind="stable")[:, :k]
    short = np.arange(k) >= count[:, None]
    if short.any():
        last = take[sentence[:, 0], np.clip(count - 1, 0, k - 1)]
        take = np.where(short, last[:, None], take)
    parents, tokens, scores = (
        ranked.rows[sentence, take],
        ranked.tokens[sentence, take],
        ranked.scores[sentence, take],
    )
    scores[short] = -np.inf
    done = count == 0
    full = finished[:, k - 1] != -np.inf  # k finished hypotheses: the stopping rule decides
    if full.any():
        done |= full & _stops(s, finished, scores[:, 0])
    parents, tokens, scores = in_place(parents, tokens, scores, sentence)
    return StepOutcome(finishing, finished, order, done, parents, tokens, scores)


def _finish(
    s: FreeSentences, ranked: Ranked, ends: np.ndarray, eos_id: int
) -> tuple[Finishing, np.ndarray, np.ndarray]:
    """The step's finishing continuations among each sentence's k best (``ends``), offered to its
    finished hypotheses: → them, the k best finished scores, and where each came from (``order``)."""
    k = s.k
    # </s> counts in a hypothesis' length, an appended token too: steps + 1 either way
    offered = normalised(ranked.scores[:, :k], s.steps[:, None] + 1, s.length_penalty[:, None])
    offered[~ends] = -np.inf
    pool = np.concatenate([s.finished, offered], axis=1)
    order = np.argsort(-pool, axis=1, kind="stable")[:, :k]  # best first, the earlier of equals first
    where = np.nonzero(ends)
    tokens = ranked.tokens[:, :k][where]
    rows, log_probs = ranked.rows[:, :k][where], ranked.scores[:, :k][where]
    finishing = Finishing(where[0], where[1], rows, tokens, offered[where], log_probs, tokens != eos_id)
    return finishing, pool[np.arange(len(pool))[:, None], order], order


def _stops(s: FreeSentences, finished: np.ndarray, best_running: np.ndarray) -> np.ndarray:
    """``SentenceSearch._stops`` over arrays, for sentences with k finished hypotheses:
    EARLY_TRUE stops; the others stop once the best running beam, normalised, cannot beat the
    worst finished one."""
    length = np.where((s.early == EARLY_NEVER) & (s.length_penalty > 0), s.max_len, s.steps + 1)
    beaten = normalised(best_running, length, s.length_penalty) <= finished[:, -1]
    stops: np.ndarray = (s.early == EARLY_TRUE) | beaten
    return stops


WIDEST_BEAM = 64  # a sentence's parent rows are bits of one int64 (``in_place``)


def in_place(
    parents: np.ndarray, tokens: np.ndarray, scores: np.ndarray, sentence: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ranking.in_place`` over arrays: each sentence's first child of a parent row takes that
    row, the others the rows left free, in order (``sentence``: (n, 1) the sentences' indices).
    A sentence's parents are bits of one integer: a child repeats a parent when adding its bit
    to those of the children before it changes nothing."""
    n, k = parents.shape
    if k == 1:
        return parents, tokens, scores
    seen = np.bitwise_or.accumulate(np.left_shift(1, parents), axis=1)  # parents so far, as bits
    repeat = np.zeros((n, k), dtype=bool)
    np.equal(seen[:, 1:], seen[:, :-1], out=repeat[:, 1:])
    taken = (seen[:, -1:] >> np.arange(k)) & 1 != 0  # (n, rows): each row's bit among them
    free = np.argsort(taken, axis=1, kind="stable")  # the free rows first, in order
    later = np.cumsum(repeat, axis=1) - 1
    target = np.where(repeat, free[sentence, np.maximum(later, 0)], parents)
    placed = np.empty_like(parents), np.empty_like(tokens), np.empty_like(scores)
    placed[0][sentence, target], placed[1][sentence, target], placed[2][sentence, target] = (
        parents,
        tokens,
        scores,
    )
    return placed


def block_order(k: np.ndarray, leaving: np.ndarray) -> np.ndarray:
    """The running sentences' new order (their old indices): each leaving block, first to last,
    takes the last running block of its size after it that has not moved yet."""
    place = np.arange(len(k))
    for size in np.unique(k).tolist():
        at = np.flatnonzero(k == size)
        gone, running = at[leaving[at]], at[~leaving[at]][::-1]
        n = min(len(gone), len(running))
        swaps = int((gone[:n] < running[:n]).sum())
        place[gone[:swaps]], place[running[:swaps]] = running[:swaps], gone[:swaps]
    order: np.ndarray = place[~leaving[place]]
    return order


def widened(x: np.ndarray, width: int, fill: object) -> np.ndarray:
    """``x`` with columns of ``fill`` added up to ``width``."""
    if x.shape[1] >= width:
        return x
    wide = np.full((x.shape[0], width), fill, dtype=x.dtype)
    wide[:, : x.shape[1]] = x
    return wide
