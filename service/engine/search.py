"""Greedy and beam search over any incremental decoder, in NumPy.

The search owns the hypotheses; the decoder owns its key/value cache. Each step the decoder
gets the last token of every running row and returns next-token log-probabilities; ``reorder``
tells it which rows survive and in what order (beams that win are copied, finished sentences
leave the running batch). The ONNX engine and the PyTorch reference both plug in here, so
their outputs can be compared token for token.

Each sentence is a ``SentenceSearch`` holding a block of ``beam_size`` consecutive rows, with
its own beam size, n-best, length penalty and length limit; a ``Search`` steps any set of them
together, and sentences may join it between steps (iteration-level batching, where the decoder
supports it: ``service/queue/continuous.py``). A sentence's result depends only on its own rows'
scores, never on the other sentences of the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal, Protocol

import numpy as np

from service.engine.constraints import Constraints, ConstraintState, constrained_step
from service.engine.ranking import best_candidates, best_continuations, in_place


@dataclass(frozen=True)
class Candidates:
    """Each row's best next tokens, best first, as a decoder graph with an in-graph ``TopK``
    returns them: at least the search's 2 × beam per row (or the whole vocabulary)."""

    log_probs: np.ndarray  # (N, n) float32
    tokens: np.ndarray  # (N, n) int64
    # The log-probs of the tokens the search asked for (``Search.wanted_tokens``: constrained
    # sentences' next constraint tokens), (N, m); None when it asked for none.
    wanted: np.ndarray | None = None


class IncrementalDecoder(Protocol):
    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        """(N,) int64 → log-probs (N, V) float32 or the rows' ``Candidates``, and, if tracked,
        cross-attention (N, S)."""
        ...

    def reorder(self, rows: np.ndarray) -> None:
        """Keep cache rows ``rows`` (int64, may repeat), in that order."""
        ...


@dataclass(frozen=True)
class TokenHypothesis:
    tokens: list[int]  # generated ids, without <s> and </s>
    score: float  # sum of log-probs / length ** length_penalty
    alignment: np.ndarray | None  # (len(tokens), S) cross-attention of each target token


def _normalise(logprob: float, length: int, length_penalty: float) -> float:
    return float(logprob / max(length, 1) ** length_penalty)


# When a sentence's beam search stops, with Hugging Face's ``early_stopping`` meanings (a model's
# generation config names one, and transformers' ``generate`` decodes by it):
# * True: once it has ``beam_size`` finished hypotheses;
# * False: once the best running beam's score normalised at its current length cannot beat the
#   worst of ``beam_size`` finished ones (transformers' heuristic, not a bound: a longer hypothesis
#   may still score better under a length penalty);
# * "never": as False, with the running beam normalised at the length limit when the penalty is
#   positive (the longest it could become).
# Either way it stops at its length limit. Greedy search (beam 1) stops at its first </s>.
EarlyStopping = bool | Literal["never"]


class SentenceSearch:
    """One sentence's beam search: ``beam_size`` rows, the best-first ``n_best`` results.

    Only the first beam is alive at the start (the others would duplicate it). Each step, of the
    2·k best continuations, the k best ones ending in </s> (or all k best at the length limit,
    unfinished there) are offered to the finished hypotheses, which keep the ``beam_size`` best
    by normalised score, and the k best others run on: transformers' beam search, step for step.
    The sentence stops as ``early_stopping`` says, or after ``max_len`` tokens.
    """

    def __init__(
        self,
        key: Any,
        *,
        beam_size: int,
        max_len: int,
        n_best: int = 1,
        length_penalty: float = 1.0,
        with_attention: bool = True,
        source_len: int | None = None,
        forced_first: int | None = None,
        early_stopping: EarlyStopping = True,
        constraints: Constraints | None = None,
    ) -> None:
        if not 1 <= n_best <= beam_size:
            raise ValueError(f"n_best must be in [1, beam_size={beam_size}], got {n_best}")
        self.key = key  # the caller's handle for this sentence
        self.with_attention = with_attention  # keep the decoder's cross-attention as alignments
        self.source_len = source_len  # its source's tokens: the alignments' width (None: as given)
        # The token every hypothesis starts with whatever the scores (a multilingual model's
        # target language, as transformers' forced_bos_token_id): scored 0 like there, counted in
        # the length and the limit, left out of the results' tokens.
        self.forced_first = forced_first
        self.k = beam_size
        self.n_best = n_best
        self.length_penalty = length_penalty
        # Greedy search ends at its first </s> (transformers' greedy search has no such setting)
        self.early_stopping: EarlyStopping = True if beam_size == 1 else early_stopping
        self.max_len = max_len
        self.steps = 0
        self.scores = np.array([0.0] + [-np.inf] * (beam_size - 1))  # (k,) running log-probs
        self.history = np.zeros((beam_size, 0), dtype=np.int64)  # (k, steps) generated tokens
        self.attention: np.ndarray | None = None  # (k, steps, S) cross-attention per token
        self.finished: list[TokenHypothesis] = []
        self.done = max_len < 1
        # Phrases every result must hold (``constraints.py``) and each row's progress on them.
        self.constraints = constraints
        self.states: list[ConstraintState] = [] if constraints is None else [constraints.start] * beam_size
        self._wanted: tuple[int, list[list[int]]] | None = None  # (step, ``wanted()``)

    def results(self) -> list[TokenHypothesis]:
        return sorted(self.finished, key=lambda h: -h.score)[: self.n_best]

    def last_tokens(self, bos_id: int) -> np.ndarray:
        return self.history[:, -1] if self.steps else np.full(self.k, bos_id, dtype=np.int64)

    def forced(self) -> list[tuple[int, int, float]] | None:
        """The first step's one continuation when the first token is forced, else None."""
        if self.steps or self.forced_first is None:
            return None
        return [(0, self.forced_first, float(self.scores[0]))]

    def wanted(self) -> list[list[int]]:
        """Each row's next constraint tokens, whose log-probs the next step must give (none
        for a free search, or a row out of the beam); worked out once a step."""
        if self.constraints is None:
            return [[]] * self.k
        if self._wanted is None or self._wanted[0] != self.steps:
            c = self.constraints
            rows = [
                c.next_tokens(state) if score > -np.inf else []
                for state, score in zip(self.states, self.scores, strict=True)
            ]
            self._wanted = self.steps, rows
        return self._wanted[1]

    def advance(
        self, candidates: Sequence[tuple[int, int, float]], attention: np.ndarray | None, eos_id: int
    ) -> np.ndarray | None:
        """Take one step from this sentence's ranked (row, token, score) continuations, best
        first (2·k of them; a constrained sentence's are followed by its rows' constraint
        tokens and best tokens), and the step's (k, S) cross-attention. → the rows to keep (k,
        into this sentence's block), or None when the sentence is done."""
        if attention is not None:
            step = attention[:, None, :]
            self.attention = step if self.attention is None else np.concatenate([self.attention, step], 1)
        if self.constraints is not None:
            return self._advance_constrained(candidates, eos_id)
        k = self.k
        at_limit = self.steps >= self.max_len - 1  # out of room: every continuation ends here
        for row, token, score in candidates[:k]:
            if score == -np.inf:
                break
            if token == eos_id:
                self.finished.append(self._finish(self.history[row], row, score, True))
            elif at_limit:
                self.finished.append(self._finish(np.append(self.history[row], token), row, score, False))
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[k:]
        going: list[tuple[int, int, float]] = []  # (row, token, score), best first
        if not at_limit:
            live = (c for c in candidates if c[1] != eos_id and c[2] != -np.inf)
            going = list(islice(live, k))
        return self._move_on(going)

    def _advance_constrained(self, pool: Sequence[tuple[int, int, float]], eos_id: int) -> np.ndarray | None:
        """``advance`` with dynamic beam allocation (``constraints.constrained_step``): only
        hypotheses that hold every phrase finish."""
        assert self.constraints is not None
        room = self.max_len - self.steps - 1
        ending, going = constrained_step(self.constraints, self.states, pool, self.k, room, eos_id)
        for row, token, score in ending:
            ended_with_eos = token == eos_id
            tokens = self.history[row] if ended_with_eos else np.append(self.history[row], token)
            self.finished.append(self._finish(tokens, row, score, ended_with_eos))
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.k :]
        return self._move_on(going if room else [])

    def _move_on(self, going: list[tuple[int, int, float]]) -> np.ndarray | None:
        """The step's running continuations (best first) become the rows; None: done."""
        if not going or self._stops(going[0][2]):
            self.done = True
            return None
        going += [(going[-1][0], going[-1][1], -np.inf)] * (self.k - len(going))  # keep a block of k
        going = in_place(going)
        rows = np.array([row for row, _, _ in going], dtype=np.int64)
        tokens = np.array([token for _, token, _ in going], dtype=np.int64)
        self.history = np.concatenate([self.history[rows], tokens[:, None]], 1)
        if self.attention is not None:
            self.attention = self.attention[rows]
        self.scores = np.array([score for _, _, score in going])
        if self.constraints is not None:
            c, states = self.constraints, self.states
            self.states = [c.advance(states[row], token) for row, token, _ in going]
        self.steps += 1
        return rows

    def _stops(self, best_running: float) -> bool:
        """Whether, with ``beam_size`` finished hypotheses, the search stops before the next step
        (``EarlyStopping``); ``best_running``: the best running beam's log-prob."""
        if len(self.finished) < self.k:
            return False
        if self.early_stopping is True:
            return True
        length = self.steps + 1  # tokens generated with this step's
        if self.early_stopping == "never" and self.length_penalty > 0:
            length = self.max_len
        return _normalise(best_running, length, self.length_penalty) <= self.finished[-1].score

    def _finish(self, tokens: np.ndarray, row: int, logprob: float, ended_with_eos: bool) -> TokenHypothesis:
        length = len(tokens) + int(ended_with_eos)
        alignment = None if self.attention is None else self.attention[row, : len(tokens)].copy()
        if self.forced_first is not None:
            tokens = tokens[1:]
            alignment = None if alignment is None else alignment[1:]
        return TokenHypothesis(
            tokens=[int(x) for x in tokens],
            score=_normalise(logprob, length, self.length_penalty),
            alignment=alignment,
        )


class Search:
    """The sentences decoding together, in row order: sentence j holds rows
    [offset_j, offset_j + k_j) of the decoder's running batch."""

    def __init__(self, bos_id: int, eos_id: int) -> None:
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.sentences: list[SentenceSearch] = []

    def add(self, sentence: SentenceSearch) -> None:
        """A new sentence's rows go after the running ones (the decoder appends them alike)."""
        self.sentences.append(sentence)

    def last_tokens(self) -> np.ndarray:
        return np.concatenate([s.last_tokens(self.bos_id) for s in self.sentences])

    def wanted_tokens(self) -> np.ndarray | None:
        """(rows, m) the tokens whose log-probs the next step must give beside each row's best
        ones (``Candidates.wanted``): the constrained sentences' next constraint tokens, padded
        with </s>; None when no row wants any (no running sentence is constrained, or each
        constrained row has met its phrases)."""
        if all(s.constraints is None for s in self.sentences):
            return None
        rows = [tokens for s in self.sentences for tokens in s.wanted()]
        width = max(map(len, rows))
        if not width:
            return None
        wanted = np.full((len(rows), width), self.eos_id, dtype=np.int64)
        for row, tokens in zip(wanted, rows, strict=True):
            row[: len(tokens)] = tokens
        return wanted

    def remove(self, gone: Callable[[SentenceSearch], bool]) -> np.ndarray:
        """Drop the sentences ``gone`` flags; → the rows to keep."""
        blocks: list[tuple[SentenceSearch, np.ndarray | None]] = []
        offset = 0
        for s in self.sentences:
            blocks.append((s, None if gone(s) else np.arange(offset, offset + s.k)))
            offset += s.k
        return self._settle(blocks)

    def _settle(self, blocks: list[tuple[SentenceSearch, np.ndarray | None]]) -> np.ndarray:
        """The running sentences' new order and rows, from (sentence, rows it keeps or None when it
        leaves) in row order: a block that leaves is filled by the last running block of the same
        size, so the decoder moves that one block instead of shifting every later one."""
        for i in range(len(blocks)):
            s, kept = blocks[i]
            if kept is not None:
                continue
            for j in range(len(blocks) - 1, i, -1):
                if blocks[j][1] is not None and blocks[j][0].k == s.k:
                    blocks[i], blocks[j] = blocks[j], blocks[i]
                    break
        running = [(s, kept) for s, kept in blocks if kept is not None]
        self.sentences = [s for s, _ in running]
        return np.concatenate([kept for _, kept in running]) if running else np.zeros(0, dtype=np.int64)

    def advance(
        self, log_probs: np.ndarray | Candidates, attention: np.ndarray | None
    ) -> tuple[np.ndarray, list[SentenceSearch]]:
        """One step's scores for every row → the rows to keep, in order, and the sentences that
        finished (no longer in ``sentences``). Sentences of one beam size are ranked together."""
        offsets = np.cumsum([0] + [s.k for s in self.sentences])
        ranked: dict[int, tuple[list[int], list[int], list[float]]] = {}
        by_k: dict[int, list[int]] = {}
        for j, s in enumerate(self.sentences):
            by_k.setdefault(s.k, []).append(j)
        for k, members in by_k.items():
            every = len(members) == len(self.sentences)  # one beam size: every row, in order
            rows = slice(None) if every else (offsets[members][:, None] + np.arange(k)).reshape(-1)
            scores = np.concatenate([self.sentences[j].scores for j in members])
            if isinstance(log_probs, Candidates):
                width = min(2 * k, log_probs.log_probs.shape[1])
                group = log_probs.log_probs[rows, :width], log_probs.tokens[rows, :width]
                top = best_candidates(scores, *group, k, 2 * k)
            else:
                top = best_continuations(scores, log_probs[rows], k, 2 * k)
            for i, j in enumerate(members):  # group rows i·k … i·k + k - 1 are sentence j's
                ranked[j] = ([r - i * k for r in top[0][i]], top[1][i], top[2][i])
        blocks: list[tuple[SentenceSearch, np.ndarray | None]] = []
        for j, s in enumerate(self.sentences):
            start = int(offsets[j])
            block = None
            if attention is not None and s.with_attention:
                block = attention[start : start + s.k, : s.source_len]
            continuations = s.forced() or [
                *zip(*ranked[j], strict=True),
                *_constraint_continuations(s, start, log_probs),
            ]
            kept = s.advance(continuations, block, self.eos_id)
            blocks.append((s, None if kept is None else kept + start))
        finished = [s for s, kept in blocks if kept is None]
        return self._settle(blocks), finished


def _constraint_continuations(
    s: SentenceSearch, start: int, log_probs: np.ndarray | Candidates
) -> list[tuple[int, int, float]]:
    """A constrained sentence's continuations beside its best ones (Post & Vilar): each row's
    next constraint tokens and its own best token, from the full log-probs or the candidates'
    ``wanted`` scores (asked for in ``Search.wanted_tokens``'s order)."""
    if s.constraints is None:
        return []
    block = slice(start, start + s.k)
    wanted = s.wanted()
    if isinstance(log_probs, Candidates):
        best_tokens = log_probs.tokens[block, 0].tolist()
        best_scores = log_probs.log_probs[block, 0].tolist()
        if log_probs.wanted is not None:
            scores_of = log_probs.wanted[block].tolist()
        elif any(wanted):
            raise ValueError("a constrained sentence's step needs its constraint tokens' log-probs")
        else:
            scores_of = [[]] * s.k
    else:
        rows = log_probs[block]
        best_tokens = rows.argmax(axis=1).tolist()
        best_scores = rows.max(axis=1).tolist()
        scores_of = [rows[row, tokens].tolist() for row, tokens in enumerate(wanted)]
    extra: list[tuple[int, int, float]] = []
    for row, score in enumerate(s.scores.tolist()):
        if score == -np.inf:
            continue
        tokens = wanted[row]
        extra += [(row, t, score + lp) for t, lp in zip(tokens, scores_of[row][: len(tokens)], strict=True)]
        extra.append((row, best_tokens[row], score + best_scores[row]))
    return extra


def beam_search(
    decoder: IncrementalDecoder,
    batch_size: int,
    *,
    beam_size: int,
    max_len: int | Sequence[int],
    bos_id: int,
    eos_id: int,
    n_best: int = 1,
    length_penalty: float = 1.0,
    early_stopping: EarlyStopping = True,
    forced_first: int | None = None,
    abandoned: Callable[[], Sequence[bool]] | None = None,
    constraints: Sequence[Constraints | None] | None = None,
) -> list[list[TokenHypothesis]]:
    """n_best hypotheses per sentence, best first. beam_size=1 is greedy decoding. A search
    stops as ``early_stopping`` says (``EarlyStopping``); ``forced_first`` is every hypothesis'
    first token (``SentenceSearch``).

    Every sentence starts at once and stops at its own ``max_len`` (one limit for all, or one per
    sentence, so that a sentence's result never depends on the others in its batch); its rows
    then leave the running batch. ``abandoned``, asked before every step, flags the sentences
    nobody waits for any more: they leave at once, with the hypotheses they have (none, usually).
    ``constraints``: each sentence's required phrases (None: a free search); a constrained
    sentence needs full log-probs from ``decoder`` (its constraint tokens' scores).
    """
    limits = np.broadcast_to(np.asarray(max_len, dtype=np.int64), (batch_size,))
    sentences = [
        SentenceSearch(
            i,
            beam_size=beam_size,
            max_len=int(limits[i]),
            n_best=n_best,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            forced_first=forced_first,
            constraints=None if constraints is None else constraints[i],
        )
        for i in range(batch_size)
    ]
    search = Search(bos_id, eos_id)
    for s in sentences:
        if not s.done:
            search.add(s)
    decoder.reorder(np.repeat(np.array([s.key for s in search.sentences], dtype=np.int64), beam_size))
    while search.sentences:
        if abandoned is not None:
            gone = abandoned()
            if any(gone[s.key] for s in search.sentences):
                decoder.reorder(search.remove(lambda s: bool(gone[s.key])))  # noqa: B023 (called at once)
                if not search.sentences:
                    break
        log_probs, attention = decoder.step(search.last_tokens())
        rows, _ = search.advance(log_probs, attention)
        if search.sentences:
            decoder.reorder(rows)
    return [s.results() for s in sentences]
