"""Greedy and beam search over any incremental decoder, in NumPy.

The search owns the hypotheses; the decoder owns its key/value cache. Each step the decoder
gets the last token of every running row and returns next-token log-probabilities; ``reorder``
tells it which rows survive and in what order (beams that win are copied, finished sentences
leave the running batch). The ONNX engine and the PyTorch reference both plug in here, so
their outputs can be compared token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class Candidates:
    """Each row's best next tokens, best first, as a decoder graph with an in-graph ``TopK``
    returns them: at least the search's 2 × beam per row (or the whole vocabulary)."""

    log_probs: np.ndarray  # (N, n) float32
    tokens: np.ndarray  # (N, n) int64


class IncrementalDecoder(Protocol):
    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray | Candidates, np.ndarray | None]:
        """(N,) int64 → log-probs (N, V) float32 or the rows' ``Candidates``, and, if tracked,
        cross-attention (N, S)."""
        ...

    def reorder(self, rows: np.ndarray) -> None:
        """Keep cache rows ``rows`` (int64, may repeat), in that order."""
        ...


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # generated ids, without <s> and </s>
    score: float  # sum of log-probs / length ** length_penalty
    alignment: np.ndarray | None  # (len(tokens), S) cross-attention of each target token


def _normalise(logprob: float, length: int, length_penalty: float) -> float:
    return logprob / max(length, 1) ** length_penalty


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
    abandoned: Callable[[], Sequence[bool]] | None = None,
) -> list[list[Hypothesis]]:
    """n_best hypotheses per sentence, best first. beam_size=1 is greedy decoding.

    A sentence stops once it has ``beam_size`` finished hypotheses (early stopping) or after
    ``max_len`` tokens (one limit for all, or one per sentence, so that a sentence's result never
    depends on the others in its batch); its rows then leave the running batch. ``abandoned``,
    asked before every step, flags the sentences nobody waits for any more: they leave at once,
    with the hypotheses they have (none, usually).
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be in [1, beam_size={beam_size}], got {n_best}")
    k = beam_size
    limits = np.broadcast_to(np.asarray(max_len, dtype=np.int64), (batch_size,))
    decoder.reorder(np.repeat(np.arange(batch_size), k))
    active = list(range(batch_size))  # sentence of each block of k rows
    # Only the first beam of each sentence is alive at the start: the others would duplicate it.
    scores = np.tile(np.array([0.0] + [-np.inf] * (k - 1)), batch_size)  # (N,)
    history = np.zeros((batch_size * k, 0), dtype=np.int64)  # generated tokens per row
    attn_history: np.ndarray | None = None  # (N, t, S)
    last = np.full(batch_size * k, bos_id, dtype=np.int64)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]

    for t in range(int(limits.max(initial=0))):
        if abandoned is not None:
            gone = abandoned()
            if any(gone[sent] for sent in active):
                active, last, scores, history, attn_history = _drop(
                    decoder, gone, active, k, last, scores, history, attn_history
                )
                if not active:
                    break
        logp, attn = decoder.step(last)  # (N, V), (N, S)
        if attn is not None:
            step_attn = attn[:, None, :]
            attn_history = step_attn if attn_history is None else np.concatenate([attn_history, step_attn], 1)
        if isinstance(logp, Candidates):
            top_rows, top_tokens, top_scores = _best_candidates(scores, logp, k, 2 * k)
        else:
            top_rows, top_tokens, top_scores = _best_continuations(scores, logp, k, 2 * k)

        keep_rows: list[int] = []
        keep_tokens: list[int] = []
        keep_scores: list[float] = []
        still_active: list[int] = []
        for j, sent in enumerate(active):
            going: list[tuple[int, int, float]] = []  # (row, token, score), best first
            for rank, (row, token, score) in enumerate(
                zip(top_rows[j], top_tokens[j], top_scores[j], strict=True)
            ):
                if score == -np.inf or len(going) == k:
                    break
                if token != eos_id:
                    going.append((row, token, score))
                elif rank < k:
                    finished[sent].append(
                        _finish(history[row], attn_history, row, score, length_penalty, True)
                    )
            if t >= limits[sent] - 1:  # out of room: the best running beams end here, unfinished
                for row, token, score in going[: k - len(finished[sent])]:
                    tokens = np.append(history[row], token)
                    finished[sent].append(_finish(tokens, attn_history, row, score, length_penalty, False))
                continue
            if len(finished[sent]) >= k or not going:
                continue
            going += [(going[-1][0], going[-1][1], -np.inf)] * (k - len(going))  # keep blocks of k
            for row, token, score in going:
                keep_rows.append(row)
                keep_tokens.append(token)
                keep_scores.append(score)
            still_active.append(sent)
        if not still_active:
            break
        rows = np.array(keep_rows, dtype=np.int64)
        decoder.reorder(rows)
        history = np.concatenate([history[rows], np.array(keep_tokens, dtype=np.int64)[:, None]], 1)
        if attn_history is not None:
            attn_history = attn_history[rows]
        scores = np.array(keep_scores)
        last = history[:, -1]
        active = still_active

    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in finished]


def _drop(
    decoder: IncrementalDecoder,
    gone: Sequence[bool],
    active: list[int],
    k: int,
    *state: np.ndarray | None,
) -> tuple[Any, ...]:
    """The running state without the blocks of the abandoned sentences."""
    keep = [j for j, sent in enumerate(active) if not gone[sent]]
    if not keep:
        return ([], *state)
    rows = (np.array(keep, dtype=np.int64)[:, None] * k + np.arange(k)).reshape(-1)
    decoder.reorder(rows)
    return ([active[j] for j in keep], *(None if x is None else x[rows] for x in state))


_BLOCK = 64  # columns per block of the top-k pre-selection


def _best_continuations(
    scores: np.ndarray, logp: np.ndarray, k: int, n: int
) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
    """The ``n`` best (row, token, score) continuations of each sentence's ``k`` rows, best first.

    score = scores[row] + logp[row, token]. An argpartition over every sentence's k × vocab
    candidates is a slow scalar pass. Instead the vocabulary is cut into blocks (block q: columns
    q, q + w, q + 2w, … for w = vocab // _BLOCK, plus a block of the leftover columns), a
    vectorised max finds the ``n`` best blocks of each sentence, which hold its ``n`` best
    candidates (a block outside them is beaten ``n`` times over), and only those are ranked.
    """
    rows, vocab = logp.shape
    sentences = rows // k
    width = vocab // _BLOCK
    n_blocks = width + (width * _BLOCK < vocab)
    block_max = np.empty((rows, n_blocks), dtype=logp.dtype)
    if width:
        np.max(logp[:, : width * _BLOCK].reshape(rows, _BLOCK, width), axis=1, out=block_max[:, :width])
    if width < n_blocks:
        block_max[:, width] = logp[:, width * _BLOCK :].max(axis=1)
    block_score = (block_max + scores[:, None]).reshape(sentences, k * n_blocks)
    m = min(n, k * n_blocks)
    blocks = np.argpartition(-block_score, m - 1, axis=1)[:, :m]  # (sentences, m): beam * n_blocks + block
    row = np.arange(sentences)[:, None] * k + blocks // n_blocks
    block = (blocks % n_blocks)[:, :, None]
    lane = np.arange(_BLOCK)
    cols = np.where(block < width, block + lane * width, width * _BLOCK + lane)  # (sentences, m, _BLOCK)
    inside = cols < vocab
    cols = np.minimum(cols, vocab - 1)
    cand = np.where(inside, logp[row[:, :, None], cols] + scores[row][:, :, None], -np.inf)
    cand = cand.reshape(sentences, m * _BLOCK)
    top = np.argpartition(-cand, n - 1, axis=1)[:, :n]
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(cand, top, 1), axis=1), 1)
    top_rows = np.take_along_axis(row, top // _BLOCK, 1)
    top_tokens = np.take_along_axis(cols.reshape(sentences, m * _BLOCK), top, 1)
    return top_rows.tolist(), top_tokens.tolist(), np.take_along_axis(cand, top, 1).tolist()


def _best_candidates(
    scores: np.ndarray, candidates: Candidates, k: int, n: int
) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
    """``_best_continuations`` from each row's best tokens: a sentence's ``n`` best continuations
    are among its rows' ``n`` best tokens each, so ranking the k × n candidates is exact."""
    rows, width = candidates.log_probs.shape
    sentences = rows // k
    cand = (candidates.log_probs + scores[:, None]).reshape(sentences, k * width)
    m = min(n, k * width)
    top = np.argsort(-cand, axis=1, kind="stable")[:, :m]
    top_rows = np.arange(sentences)[:, None] * k + top // width
    top_tokens = np.take_along_axis(candidates.tokens.reshape(sentences, k * width), top, 1)
    return top_rows.tolist(), top_tokens.tolist(), np.take_along_axis(cand, top, 1).tolist()


def _finish(
    tokens: np.ndarray,
    attn_history: np.ndarray | None,
    row: int,
    logprob: float,
    length_penalty: float,
    ended_with_eos: bool,
) -> Hypothesis:
    length = len(tokens) + int(ended_with_eos)
    alignment = None if attn_history is None else attn_history[row, : len(tokens)].copy()
    return Hypothesis(
        tokens=[int(x) for x in tokens],
        score=_normalise(logprob, length, length_penalty),
        alignment=alignment,
    )
