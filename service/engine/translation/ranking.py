"""Each sentence's best beam continuations in one step, from full log-probs or from a decoder's
per-row candidates, vectorised over every sentence of one beam size (``search.Search``), and the
rows they go to."""

from __future__ import annotations

from operator import itemgetter

import numpy as np

_BLOCK = 64  # columns per block of the top-k pre-selection


def best_continuations(
    scores: np.ndarray, logp: np.ndarray, k: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``n`` best (row, token, score) continuations of each sentence's ``k`` rows, best first,
    each row within its sentence's block (0 … k-1).

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
    top_rows = np.take_along_axis(row, top // _BLOCK, 1) - np.arange(sentences)[:, None] * k
    top_tokens = np.take_along_axis(cols.reshape(sentences, m * _BLOCK), top, 1)
    return top_rows, top_tokens, np.take_along_axis(cand, top, 1)


def best_candidates(
    scores: np.ndarray, log_probs: np.ndarray, tokens: np.ndarray, k: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``best_continuations`` from each row's best tokens (``log_probs``, ``tokens``: (rows,
    width), a decoder's candidates): a sentence's ``n`` best continuations are among its rows'
    ``n`` best tokens each, so ranking the k × n candidates is exact."""
    rows, width = log_probs.shape
    sentences = rows // k
    cand = (log_probs + scores[:, None]).reshape(sentences, k * width)
    m = min(n, k * width)
    top = np.argsort(-cand, axis=1, kind="stable")[:, :m]
    sentence = np.arange(sentences)[:, None]
    top_tokens = tokens.reshape(sentences, k * width)[sentence, top]
    return top // width, top_tokens, cand[sentence, top]


def best_listed(
    scores: np.ndarray, log_probs: np.ndarray, tokens: np.ndarray, start: int, k: int
) -> list[tuple[int, int, float]]:
    """``best_candidates`` for the sentence whose ``k`` rows start at ``start``, in Python, from
    the step's candidates (``log_probs``, ``tokens``: (rows, width)): its 2·k best (row within
    its block, token, score) continuations in the same order (equal scores: the earlier row,
    then the better-ranked token). For a few sentences NumPy's cost per call outweighs the
    arrays it saves."""
    block = slice(start, start + k)
    width = min(2 * k, log_probs.shape[1])
    rows = zip(
        scores[block].tolist(), log_probs[block, :width].tolist(), tokens[block, :width].tolist(), strict=True
    )
    pool = [
        (score + lp, row, t)
        for row, (score, lps, ids) in enumerate(rows)
        for lp, t in zip(lps, ids, strict=True)
    ]
    pool.sort(key=itemgetter(0), reverse=True)  # stable (equals keep their order), as the argsort
    return [(row, token, score) for score, row, token in pool[: 2 * k]]


def in_place(going: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """The step's continuations (row, token, score), each placed in its parent's row when that
    row has no child yet, the others in the rows left free: the decoder then copies a history
    only for a parent's second and later children, not for every beam that changed place. The
    order depends on this sentence's own continuations only."""
    placed: list[tuple[int, int, float] | None] = [None] * len(going)
    later = []
    for child in going:
        if placed[child[0]] is None:
            placed[child[0]] = child
        else:
            later.append(child)
    free = (i for i, child in enumerate(placed) if child is None)
    for child in later:
        placed[next(free)] = child
    return [child for child in placed if child is not None]
