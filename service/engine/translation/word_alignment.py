"""Word alignments read from a translation's cross-attention.

Subword pieces are grouped into words on both sides (a word starts at a ``▁`` piece, as
SentencePiece writes it, or after a gap in the text); a word pair weighs the sum of its pieces'
attention; a target word is linked to a source word when each is the other's best (the
intersection of both directions: precise, it leaves function words that spread their attention
unlinked). What a span of source words becomes in the translation is the smallest range of
target words covering those linked to it, else each one's best target word.

Inline markup (service/text/inline.py) and glossary terms (placement.py) are both put where
these alignments say.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WORD_START = "▁"  # SentencePiece's word boundary, which Marian and our tokenizers use


def word_weights(
    alignment: Sequence[Sequence[float]] | np.ndarray,
    target_of: Sequence[int],
    source_of: Sequence[int],
    shape: tuple[int, int],
) -> np.ndarray:
    """(target words, source words): the pieces' attention summed; ``target_of``/``source_of``
    give each piece's word (-1: none, a special token's)."""
    matrix = np.asarray(alignment, dtype=np.float64).reshape(len(target_of), -1)
    n_source = min(matrix.shape[1], len(source_of))
    targets = np.zeros((shape[0], len(target_of)))
    for t, tw in enumerate(target_of):
        if tw >= 0:
            targets[tw, t] = 1.0
    sources = np.zeros((n_source, shape[1]))
    for s, sw in enumerate(source_of[:n_source]):
        if sw >= 0:
            sources[s, sw] = 1.0
    return targets @ matrix[:, :n_source] @ sources


class WordLinks:
    """The links of one word-weights matrix (``word_weights``)."""

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights
        self.best_target = weights.argmax(axis=0)  # each source word's best target word
        best_source = weights.argmax(axis=1)
        self.linked: dict[int, list[int]] = {}
        for tw, sw in enumerate(best_source.tolist()):
            if self.best_target[sw] == tw and weights[tw, sw] > 0:
                self.linked.setdefault(sw, []).append(tw)

    def targets(self, source_words: Sequence[int]) -> list[int]:
        """The target words of ``source_words``: those linked to them, else each one's best
        (none when they drew no attention at all)."""
        found = [tw for sw in source_words for tw in self.linked.get(sw, [])]
        if not found:
            found = [int(self.best_target[sw]) for sw in source_words if self.weights[:, sw].any()]
        return found

    def span(self, source_words: Sequence[int]) -> tuple[int, int] | None:
        """The smallest range [first, last] of target words covering ``targets``; None: none."""
        found = self.targets(source_words)
        return (min(found), max(found)) if found else None


def target_words(pieces: Sequence[str]) -> list[int]:
    """Each piece's word in a generated translation: a new one at each ``▁`` piece."""
    of_piece: list[int] = []
    word = -1
    for piece in pieces:
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        of_piece.append(word)
    return of_piece


def source_words(pieces: Sequence[str], offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Each piece's word in an encoded text, from the pieces' character offsets: a piece goes on
    its word when it touches the piece before and does not start with ``▁``; special tokens (no
    characters) have none (-1)."""
    of_piece: list[int] = []
    word, end = -1, -1
    for piece, (start, stop) in zip(pieces, offsets, strict=True):
        if stop <= start:
            of_piece.append(-1)
            continue
        if word < 0 or start != end or piece.startswith(WORD_START):
            word += 1
        of_piece.append(word)
        end = stop
    return of_piece
