"""What ``Search``'s array step records so that a free sentence keeping alignments gets each
finished hypothesis' alignment and token log-probs without carrying them along every step.

``SentenceSearch`` keeps every row's whole cross-attention and token log-probs and reorders them
with its rows every step. For the sentences the array step (``beam_step.py``) advances,
``StepRecords`` keeps each decoder step's cross-attention (rows, S), the rows' running log-probs
before it, and the rows the step kept (row i of the next step continues row ``kept[i]``). A
hypothesis that finishes on a row is traced back through those parents: its ancestors' attention
is its alignment, and the differences of their running log-probs its tokens' log-probs, the very
values ``SentenceSearch`` would have carried. Steps older than the oldest running such sentence's
first are let go.
"""

from __future__ import annotations

import numpy as np

from service.engine.translation.beam_step import Finishing


class StepRecords:
    def __init__(self) -> None:
        self._attention: list[np.ndarray | None] = []  # per step: (rows, S) in its rows' order
        self._scores: list[np.ndarray] = []  # per step: each row's running log-prob before it
        self._kept: list[np.ndarray] = []  # per step ended: the rows the next step continues

    def begin(self, attention: np.ndarray | None, scores: np.ndarray) -> None:
        """A step's attention and its rows' running log-probs, as it starts."""
        self._attention.append(attention)
        self._scores.append(scores.copy())

    def end(self, kept: np.ndarray, longest: int) -> None:
        """The rows the step kept, in the next step's order; ``longest``: the most steps a
        running sentence that is traced has taken (older steps are let go)."""
        self._kept.append(kept)
        drop = len(self._kept) - longest
        if drop > 0:
            del self._attention[:drop], self._scores[:drop], self._kept[:drop]

    def moved(self, rows: np.ndarray, count: int) -> None:
        """Rows moved between two steps (sentences left): row i is now row ``rows[i]`` of the
        ``count`` there were (those that joined since the last step continue none)."""
        if self._kept:
            last = self._kept[-1]
            self._kept[-1] = np.concatenate([last, np.full(count - len(last), -1, dtype=last.dtype)])[rows]

    @property
    def held(self) -> int:
        """Steps held."""
        return len(self._scores)

    @property
    def begun(self) -> bool:
        """Whether a step has begun and not ended."""
        return len(self._scores) > len(self._kept)

    def clear(self) -> None:
        self._attention, self._scores, self._kept = [], [], []

    def trace(self, rows: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """``rows`` of the step begun, whose sentences took ``steps`` steps before it: each row's
        ancestors' attention (n, m, widest S) and running log-probs before each step (n, m),
        m = steps.max() + 1, the step begun last; row i's own are its last ``steps[i] + 1``."""
        m = int(steps.max(initial=0)) + 1
        chain = [rows]
        for kept in reversed(self._kept[len(self._kept) - m + 1 :]):
            chain.append(np.take(kept, chain[-1], mode="clip"))  # before a row's first: unused
        chain.reverse()
        attention, scores = self._attention[-m:], self._scores[-m:]
        ran = np.stack([np.take(s, at, mode="clip") for s, at in zip(scores, chain, strict=True)], axis=1)
        given = [a for a in attention if a is not None]
        if not given:
            return None, ran
        seen = np.zeros((len(rows), m, max(a.shape[1] for a in given)), dtype=given[0].dtype)
        for j, (a, at) in enumerate(zip(attention, chain, strict=True)):
            if a is not None:
                seen[:, j, : a.shape[1]] = np.take(a, at, axis=0, mode="clip")
        return seen, ran


def offered_traces(
    records: StepRecords,
    finishing: Finishing,
    traced: np.ndarray,
    rows: np.ndarray,
    steps: np.ndarray,
    skip: np.ndarray,
    widths: list[int | None],
    shape: tuple[int, int],
) -> np.ndarray:
    """(sentences, k) the (alignment, token log-probs) of the ``traced`` ones of the step's
    ``finishing`` hypotheses at their (sentence, column), as ``SentenceSearch._finish`` makes
    them; per finishing hypothesis its row of the step begun, the steps its sentence took before
    it, whether its first token is a forced one (left out); per traced one its source's tokens."""
    at = np.flatnonzero(traced)
    seen, ran = records.trace(rows[at], steps[at])
    lengths = steps[at] + finishing.appended[at]  # its tokens, the appended one included
    offered = np.empty(shape, dtype=object)
    m = ran.shape[1]
    places = zip(finishing.sentence[at].tolist(), finishing.column[at].tolist(), strict=True)
    for i, ((sentence, column), n, length, first) in enumerate(
        zip(places, steps[at].tolist(), lengths.tolist(), skip[at].tolist(), strict=True)
    ):
        own = ran[i, m - 1 - n :]
        log_probs = np.concatenate([np.diff(own), [finishing.log_prob[at[i]] - own[-1]]])
        alignment = None if seen is None else seen[i, m - 1 - n : m - 1 - n + length, : widths[i]]
        offered[sentence, column] = (None if alignment is None else alignment[first:], log_probs[first:])
    return offered
