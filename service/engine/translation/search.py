"""Greedy and beam search over any incremental decoder, in NumPy.

The search owns the hypotheses; the decoder owns its key/value cache. Each step the decoder
gets the last token of every running row and returns next-token log-probabilities; ``reorder``
tells it which rows survive and in what order (beams that win are copied, finished sentences
leave the running batch). The ONNX engine and the PyTorch reference both plug in here, so
their outputs can be compared token for token.

Each sentence is a ``SentenceSearch`` (sentence_search.py) holding a block of ``beam_size``
consecutive rows, with its own beam size, n-best, length penalty and length limit; a ``Search``
steps any set of them
together, and sentences may join it between steps (iteration-level batching, where the decoder
supports it: ``service/queue/continuous.py``). A sentence's result depends only on its own rows'
scores, never on the other sentences of the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from service.engine.translation.constraints import Constraints
from service.engine.translation.ranking import best_candidates, best_continuations
from service.engine.translation.sentence_search import EarlyStopping, SentenceSearch, TokenHypothesis


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
