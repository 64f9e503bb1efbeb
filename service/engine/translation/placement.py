"""Required phrases put where the model's alignment of a free translation says.

A sentence with required phrases (glossary terms, kept spans' placeholders) is searched free
first (running.py). When its best free translation misses one that has a source span
(``TranslateOptions.required_sources``), the span's source words are looked up in that
translation's alignment (word_alignment.py): the smallest run of target words they align to is
where the phrase goes. The sentence is then searched again, forced through the free
translation's tokens up to that run, then through the phrase, and free from there, so that what
follows can agree with the phrase. The words the phrase took the place of may not come back
after it: a model that does not know the phrase would translate its source words again.

With several phrases placed, the free tokens between their runs are forced too, and the model
goes on after the last one; phrases whose runs overlap (two terms on one target word) share the
runs' union, side by side. A phrase that aligns to nothing or has no source span is left to the
constrained search over what follows (constraints.py), as are the phrases the free translation
has after the last placed one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.engine.base import Encoded
from service.engine.translation.constraints import Spelling
from service.engine.translation.sentence_search import TokenHypothesis
from service.engine.translation.word_alignment import WordLinks, source_words, target_words, word_weights


@dataclass(frozen=True)
class Placement:
    prefix: tuple[int, ...]  # the tokens forced: free ones, and each placed phrase's
    placed: frozenset[str]  # the phrases in it (the others are left to the constrained search)
    replaced: frozenset[int]  # the first tokens of the free words the phrases took the place of
    rest_from: int  # the first free token after the last phrase's run
    first_at: int  # the free tokens before the first phrase


def place(
    free: TokenHypothesis,
    pieces: Sequence[str],
    source: Encoded,
    phrases: Sequence[tuple[str, tuple[int, int] | None]],
    spell: Callable[[str, bool], Spelling],
) -> Placement | None:
    """Where ``phrases`` (each with its source span; those of a free translation's miss) go in
    ``free`` (its tokens as ``pieces``), by its alignment over ``source``; ``spell(phrase,
    at_start)`` gives a phrase's tokens. None when none can be placed."""
    if free.alignment is None or source.offsets is None or not free.tokens:
        return None
    of_target = target_words(pieces)
    of_source = source_words(source.tokens, source.offsets)
    if max(of_source, default=-1) < 0:
        return None
    weights = word_weights(free.alignment, of_target, of_source, (of_target[-1] + 1, max(of_source) + 1))
    links = WordLinks(weights)
    found: list[tuple[int, int, str]] = []  # (first, last target word, phrase), in source order
    for phrase, span in phrases:
        words = _words_in(span, source, of_source)
        run = links.span(words) if words else None
        if run is not None:
            found.append((*run, phrase))
    if not found:
        return None
    prefix: list[int] = []
    replaced: set[int] = set()
    at = 0  # the free tokens forced so far
    runs = _merged(found)
    for first, last, run_phrases in runs:
        start = of_target.index(first)
        prefix += free.tokens[at:start]
        for phrase in run_phrases:
            prefix += spell(phrase, not prefix)
        at = len(of_target) - of_target[::-1].index(last)
        replaced.update(
            free.tokens[i] for i in range(start, at) if i == start or of_target[i] != of_target[i - 1]
        )
    placed = frozenset(phrase for _, _, phrase in found)
    return Placement(tuple(prefix), placed, frozenset(replaced), at, of_target.index(runs[0][0]))


def _merged(found: list[tuple[int, int, str]]) -> list[tuple[int, int, list[str]]]:
    """The runs in target order, those that overlap as one with their phrases side by side in
    their sources' order: two terms aligned to one word, as "U-Bahn" and "Bahnsteig" to "subway"."""
    merged: list[tuple[int, int, list[int]]] = []  # (first, last, indices into ``found``)
    for i in sorted(range(len(found)), key=lambda i: (found[i][0], i)):
        first, last, _ = found[i]
        if merged and first <= merged[-1][1]:
            head, tail, held = merged[-1]
            merged[-1] = (head, max(tail, last), [*held, i])
        else:
            merged.append((first, last, [i]))
    return [(first, last, [found[i][2] for i in sorted(held)]) for first, last, held in merged]


def _words_in(span: tuple[int, int] | None, source: Encoded, of_source: list[int]) -> list[int]:
    """The source words with a piece inside ``span`` (characters of the text)."""
    if span is None or source.offsets is None:
        return []
    start, end = span
    found = {
        word
        for word, (s, e) in zip(of_source, source.offsets, strict=True)
        if word >= 0 and s < end and e > start
    }
    return sorted(found)
