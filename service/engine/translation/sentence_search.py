"""One sentence's beam search (``SentenceSearch``): its rows' scores, history, alignments and
finished hypotheses, its stopping rule, and its constraints' progress; ``search.Search`` steps
many of them together over one decoder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from itertools import islice
from typing import Any, Literal

import numpy as np

from service.engine.translation.constraints import Constraints, ConstraintState, constrained_step
from service.engine.translation.forcing import Prefix, Rest
from service.engine.translation.ranking import in_place


@dataclass(frozen=True)
class TokenHypothesis:
    tokens: list[int]  # generated ids, without <s> and </s>
    score: float  # sum of log-probs / length ** length_penalty
    alignment: np.ndarray | None  # (len(tokens), S) cross-attention of each target token
    # Each token's log-prob, then its </s>'s if it ended with one (kept with the alignment)
    token_log_probs: np.ndarray | None = None


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
    """One sentence's beam search: ``beam_size`` rows (one while a forced prefix runs: its
    tokens are the only continuations), the best-first ``n_best`` results.

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
        prefix: Prefix | None = None,
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
        self.beam_size = beam_size
        self.n_best = n_best
        self.length_penalty = length_penalty
        # Greedy search ends at its first </s> (transformers' greedy search has no such setting)
        self.early_stopping: EarlyStopping = True if beam_size == 1 else early_stopping
        self.max_len = max_len
        self.steps = 0
        self.prefix = prefix
        self.k = self._rows_for(0)  # its rows now: the beam, or one while a prefix forces its tokens
        self.scores = np.array([0.0] + [-np.inf] * (self.k - 1))  # (k,) running log-probs
        self.history = np.zeros((self.k, 0), dtype=np.int64)  # (k, steps) generated tokens
        self.attention: np.ndarray | None = None  # (k, steps, S) cross-attention per token
        # (k, steps) each token's log-prob, kept with the attention (``Rest``'s, for placement)
        self.token_log_probs = np.zeros((self.k, 0)) if with_attention else None
        self.finished: list[TokenHypothesis] = []
        # The hypotheses the last step finished, each with the row it ended on (free search only)
        self.ended_on: list[tuple[TokenHypothesis, int]] = []
        self.done = max_len < 1
        # Phrases every result must hold (``constraints.py``) and each row's progress on them.
        self.constraints = constraints
        self.states: list[ConstraintState] = [] if constraints is None else [constraints.start] * self.k
        self._wanted: tuple[int, list[list[int]]] | None = None  # (step, ``wanted()``)

    def resume(self, tokens: Sequence[int], log_probs: np.ndarray, alignment: np.ndarray | None) -> None:
        """Start as if it had written ``tokens`` (its forced first one and its prefix's first
        ones, that the decoder's row was given the history of: ``Decoder.resume``), each with its
        log-prob and cross-attention as the free search had them."""
        forced = len(self.prefix.tokens) + (self.forced_first is not None) if self.prefix else 0
        if self.steps or not 0 < len(tokens) < forced:
            raise ValueError("only a search not started resumes, within its forced prefix")
        self.history = np.array([tokens], dtype=np.int64)
        self.scores = np.array([float(log_probs.sum())])
        if self.constraints is not None:  # the phrases it holds already count
            self.states = [reduce(self.constraints.advance, tokens, self.constraints.start)]
        if self.token_log_probs is not None:
            self.token_log_probs = log_probs[None, :].astype(float)
        if self.with_attention and alignment is not None:
            self.attention = alignment[None].copy()
        self.steps = len(tokens)

    def results(self) -> list[TokenHypothesis]:
        return sorted(self.finished, key=lambda h: -h.score)[: self.n_best]

    def keep_finished(self, holds: Callable[[list[int]], bool]) -> bool:
        """Keep the finished hypotheses whose tokens ``holds``; → whether ``n_best`` are left."""
        self.finished = [h for h in self.finished if holds(h.tokens)]
        return len(self.finished) >= self.n_best

    def last_tokens(self, bos_id: int) -> np.ndarray:
        return self.history[:, -1] if self.steps else np.full(self.k, bos_id, dtype=np.int64)

    def _rows_for(self, step: int) -> int:
        """The rows step ``step`` needs: one for a prefix token (the only continuation), else the beam."""
        if self.prefix is not None and step < len(self.prefix.tokens) + (self.forced_first is not None):
            return 1
        return self.beam_size

    @property
    def wants_tokens(self) -> bool:
        """Whether its steps may need log-probs of given tokens (``wanted``)."""
        return self.constraints is not None or self.prefix is not None

    def _prefix_at(self) -> int | None:
        """The prefix token the next step is forced to, if one is."""
        if self.prefix is None:
            return None
        at = self.steps - (self.forced_first is not None)
        return self.prefix.tokens[at] if 0 <= at < len(self.prefix.tokens) else None

    @property
    def at_prefix_end(self) -> bool:
        """Whether the next step is the first after its forced prefix: the one where the pieces
        that would glue themselves to the prefix's last word are barred (``Prefix.not_after``)."""
        return self.prefix is not None and self.steps - (self.forced_first is not None) == len(
            self.prefix.tokens
        )

    def after_prefix(self, start: int, log_probs: Any) -> list[tuple[int, int, float]]:
        """The continuations of its one live row at its prefix's end, every candidate the step
        gave (a wide step: ``RunningDecode.step``), best first: after a word the model does not
        know, its best few are often all pieces that would glue themselves to it."""
        score = float(self.scores[0])
        if isinstance(log_probs, np.ndarray):
            row = log_probs[start]
            tokens = np.argsort(-row, kind="stable")
            return [(0, int(t), score + float(row[t])) for t in tokens.tolist()]
        lps, tokens = log_probs.log_probs[start].tolist(), log_probs.tokens[start].tolist()
        return [(0, t, score + lp) for t, lp in zip(tokens, lps, strict=True)]

    def forced(self, start: int, log_probs: Any) -> list[tuple[int, int, float]] | None:
        """The step's one continuation when its token is forced (the first token; a prefix
        token, scored by ``log_probs``, the step's, where its rows start at ``start``), else None."""
        if self.steps == 0 and self.forced_first is not None:
            return [(0, self.forced_first, float(self.scores[0]))]
        token = self._prefix_at()
        if token is None:
            return None
        return [(0, token, float(self.scores[0]) + self._wanted_scores(start, log_probs)[0][0])]

    def wanted(self) -> list[list[int]]:
        """Each row's next constraint tokens (or the prefix's next token), whose log-probs the
        next step must give (none for a free search, or a row out of the beam); worked out once
        a step."""
        if (token := self._prefix_at()) is not None:
            return [[token]] + [[]] * (self.k - 1)
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

    def constraint_continuations(self, start: int, log_probs: Any) -> list[tuple[int, int, float]]:
        """A constrained sentence's continuations beside its best ones (Post & Vilar): each row's
        next constraint tokens and its own best token, from the step's full log-probs or its
        candidates' ``wanted`` scores (asked for in ``Search.wanted_tokens``'s order); its rows
        start at ``start``."""
        if self.constraints is None:
            return []
        best_tokens, best_scores = self._best(start, log_probs)
        scores_of = self._wanted_scores(start, log_probs)
        wanted = self.wanted()
        extra: list[tuple[int, int, float]] = []
        for row, score in enumerate(self.scores.tolist()):
            if score == -np.inf:
                continue
            tokens = wanted[row]
            extra += [
                (row, t, score + lp) for t, lp in zip(tokens, scores_of[row][: len(tokens)], strict=True)
            ]
            extra.append((row, best_tokens[row], score + best_scores[row]))
        return extra

    def _best(self, start: int, log_probs: Any) -> tuple[list[int], list[float]]:
        """Each of its rows' best next token and its log-prob."""
        block = slice(start, start + self.k)
        if not isinstance(log_probs, np.ndarray):  # a decoder's ``search.Candidates``
            return log_probs.tokens[block, 0].tolist(), log_probs.log_probs[block, 0].tolist()
        rows = log_probs[block]
        return rows.argmax(axis=1).tolist(), rows.max(axis=1).tolist()

    def _wanted_scores(self, start: int, log_probs: Any) -> list[list[float]]:
        """Each of its rows' log-probs of its ``wanted`` tokens, from the step's full log-probs
        or its candidates' ``wanted`` scores (asked for in ``Search.wanted_tokens``' order)."""
        block = slice(start, start + self.k)
        wanted = self.wanted()
        if isinstance(log_probs, np.ndarray):
            return [log_probs[start + row, tokens].tolist() for row, tokens in enumerate(wanted)]
        if log_probs.wanted is not None:
            scores: list[list[float]] = log_probs.wanted[block].tolist()
            return scores
        if any(wanted):
            raise ValueError("a constrained sentence's step needs its constraint tokens' log-probs")
        return [[]] * self.k

    def advance(
        self, candidates: Sequence[tuple[int, int, float]], attention: np.ndarray | None, eos_id: int
    ) -> np.ndarray | None:
        """Take one step from this sentence's ranked (row, token, score) continuations, best
        first (2·k of them; a constrained sentence's are followed by its rows' constraint
        tokens and best tokens), and the step's (k, S) cross-attention. → the rows to keep (k,
        into this sentence's block), or None when the sentence is done."""
        self.ended_on = []
        if attention is not None:
            step = attention[:, None, :]
            self.attention = step if self.attention is None else np.concatenate([self.attention, step], 1)
        forcing = self._prefix_at() is not None  # a prefix token: the constraints only follow it
        if self.prefix is not None:
            candidates = self.prefix.allowed(list(candidates), self.steps - (self.forced_first is not None))
        if self.constraints is not None and not forcing:
            return self._advance_constrained(candidates, eos_id)
        k = self.beam_size
        at_limit = self.steps >= self.max_len - 1  # out of room: every continuation ends here
        for row, token, score in candidates[:k]:
            if score == -np.inf:
                break
            if token == eos_id or at_limit:
                tokens = self.history[row] if token == eos_id else np.append(self.history[row], token)
                self.finished.append(self._finish(tokens, row, score, token == eos_id))
                self.ended_on.append((self.finished[-1], row))
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[k:]
        going: list[tuple[int, int, float]] = []  # (row, token, score), best first
        if not at_limit:
            live = (c for c in candidates if c[1] != eos_id and c[2] != -np.inf)
            going = list(islice(live, k))
        rows = self._move_on(going)
        if rows is not None and self._rejoined():
            self.done = True
            return None
        return rows

    @property
    def _rejoins(self) -> bool:
        """Whether it may end on the free translation after its placed terms (``_rejoined``): one
        result, no constraints left, at or past its prefix's end."""
        p, forced = self.prefix, self.forced_first is not None
        at_end = p is not None and p.rest is not None and self.steps - forced >= len(p.tokens)
        return at_end and self.constraints is None and self.n_best == 1

    def _rejoined(self) -> bool:
        """Whether its best row is back on the free translation after its placed terms
        (``Prefix.rejoined_at``): it then ends with the rest's tokens after that, scored as the
        free search scored them, as the model would write them again (docs/decisions.md);
        decoding them would cost a second search's whole tail."""
        if not self._rejoins:
            return False
        p = self.prefix
        assert p is not None and p.rest is not None
        best = int(np.argmax(self.scores))
        written = self.steps - (self.forced_first is not None) - len(p.tokens)  # since the prefix
        at = p.rejoined_at(self.history[best, self.steps - written :].tolist(), self.max_len - self.steps)
        if at is None:
            return False
        tokens = np.concatenate([self.history[best], np.array(p.rest.tokens[at:], dtype=np.int64)])
        logprob = float(self.scores[best] + p.rest.log_probs[at:].sum())
        hypothesis = self._finish(tokens, best, logprob, True, p.rest, at)
        self.finished = sorted([*self.finished, hypothesis], key=lambda h: -h.score)[: self.beam_size]
        return True

    def _advance_constrained(self, pool: Sequence[tuple[int, int, float]], eos_id: int) -> np.ndarray | None:
        """``advance`` with dynamic beam allocation (``constraints.constrained_step``): only
        hypotheses that hold every phrase finish."""
        assert self.constraints is not None
        room = self.max_len - self.steps - 1
        ending, going = constrained_step(self.constraints, self.states, pool, self.beam_size, room, eos_id)
        if not ending and not going and not self.finished:
            # every continuation barred (a met phrase's word may not go on; </s> not among the
            # candidates): the rows that hold every phrase end as they stand, as at the limit
            ending = [
                (row, -1, score) for row, score in enumerate(self.scores.tolist()) if self._holds_all(row)
            ]
        for row, token, score in ending:
            ended_with_eos = token == eos_id
            tokens = self.history[row] if ended_with_eos or token < 0 else np.append(self.history[row], token)
            self.finished.append(self._finish(tokens, row, score, ended_with_eos))
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.beam_size :]
        return self._move_on(going if room else [])

    def _holds_all(self, row: int) -> bool:
        assert self.constraints is not None
        return self.scores[row] > -np.inf and self.constraints.done(self.states[row])

    def _move_on(self, going: list[tuple[int, int, float]]) -> np.ndarray | None:
        """The step's running continuations (best first) become the rows; None: done."""
        if not going or self._stops(going[0][2]):
            self.done = True
            return None
        self.k = self._rows_for(self.steps + 1)
        going += [(going[-1][0], going[-1][1], -np.inf)] * (self.k - len(going))  # keep a block of k
        going = in_place(going)
        rows = np.array([row for row, _, _ in going], dtype=np.int64)
        tokens = np.array([token for _, token, _ in going], dtype=np.int64)
        self.history = np.concatenate([self.history[rows], tokens[:, None]], 1)
        if self.attention is not None:
            self.attention = self.attention[rows]
        scores = np.array([score for _, _, score in going])
        if self.token_log_probs is not None:
            with np.errstate(invalid="ignore"):  # a row out of the beam: -inf after -inf
                taken = scores - self.scores[rows]
            self.token_log_probs = np.concatenate([self.token_log_probs[rows], taken[:, None]], 1)
        self.scores = scores
        if self.constraints is not None:
            c, states = self.constraints, self.states
            self.states = [c.advance(states[row], token) for row, token, _ in going]
        self.steps += 1
        return rows

    def _stops(self, best_running: float) -> bool:
        """Whether, with ``beam_size`` finished hypotheses, the search stops before the next step
        (``EarlyStopping``); ``best_running``: the best running beam's log-prob. A placed search's
        tail (``_rejoins``) stops as soon as its one result beats every running row, as
        ``early_stopping`` False would with one finished hypothesis: it has rejoined the free
        translation or ended, and its other beams would only wait for more results."""
        if self._rejoins:
            length = self.steps + 1  # tokens generated with this step's
            best_finished = self.finished[0].score if self.finished else -np.inf
            return _normalise(best_running, length, self.length_penalty) <= best_finished
        if len(self.finished) < self.beam_size:
            return False
        if self.early_stopping is True:
            return True
        length = self.steps + 1  # tokens generated with this step's
        if self.early_stopping == "never" and self.length_penalty > 0:
            length = self.max_len
        return _normalise(best_running, length, self.length_penalty) <= self.finished[-1].score

    def _finish(
        self,
        tokens: np.ndarray,
        row: int,
        logprob: float,
        ended_with_eos: bool,
        rest: Rest | None = None,  # ``tokens`` end with ``rest``'s from ``at`` on (``_rejoined``)
        at: int = 0,
    ) -> TokenHypothesis:
        length = len(tokens) + int(ended_with_eos)
        alignment = None if self.attention is None else self.attention[row, : len(tokens)].copy()
        if rest is not None and alignment is not None:  # the rest's as the free search aligned it
            alignment = np.concatenate([alignment, rest.alignment[at:]])
        log_probs = None
        if self.token_log_probs is not None:  # then the one it ends with (or its </s>), or the rest's
            last = rest.log_probs[at:] if rest is not None else [logprob - self.scores[row]]
            log_probs = np.concatenate([self.token_log_probs[row, : self.steps], last])[:length]
        skip = int(self.forced_first is not None)  # its forced first token is not a result's
        return TokenHypothesis(
            tokens=[int(x) for x in tokens[skip:]],
            score=_normalise(logprob, length, self.length_penalty),
            alignment=None if alignment is None else alignment[skip:],
            token_log_probs=None if log_probs is None else log_probs[skip:],
        )
