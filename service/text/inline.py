"""Inline elements placed on a translation by the model's alignment.

A sentence's inline markup (HTML's ``<b>``, ``<a href>``...; a document's formatting runs) is
taken out before translation: the model translates the plain text, and each element comes back
as a character range of the translation, computed from the cross-attention alignment:

* Subwords → words on both sides (a word starts at a ``▁`` piece or after whitespace), and
  words linked where each is the other's best (service/engine/translation/word_alignment.py).
* An element's target words are those linked to its source words, else each of its source
  words' best target word; its range is the smallest one covering them and its children's.
  An element over all its parent's words keeps all of its parent's range.
* Nesting and order are kept: an element lies inside its parent's range and after its previous
  sibling's; one that aligns to nothing (or is squeezed out so) is an empty range beside its
  neighbours, never dropped. Punctuation at a range's edge stays outside it unless the element's
  source has punctuation there ("<b>snow</b>." → "<b>Schnee</b>.").

``place`` gives the ranges; ``fill`` turns the ranges of a flat sequence of runs (a document
paragraph's) into a partition of the translation, since every character of a run-based paragraph
belongs to some run.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from service.engine.translation.word_alignment import WORD_START, WordLinks, word_weights


@dataclass(frozen=True)
class Element:
    start: int  # [start, end) of the element's text in the source sentence
    end: int
    parent: int  # index of the enclosing element in the same list (parents come first); -1: none


def token_spans(text: str, tokens: Sequence[str]) -> list[tuple[int, int] | None]:
    """Each token's [start, end) in ``text`` (None for special or unknown tokens), by reading the
    tokens in order over the text: a tokenizer's normalisation can make a token unreadable there,
    and then only that token has no span."""
    spans: list[tuple[int, int] | None] = []
    at = 0
    for token in tokens:
        piece = token.replace(WORD_START, " ").strip()
        found = text.find(piece, at, at + len(piece) + 8) if piece else -1
        if found < 0 or text[at:found].strip():
            spans.append(None)
            continue
        spans.append((found, found + len(piece)))
        at = found + len(piece)
    return spans


def _words(text: str, tokens: Sequence[str]) -> tuple[list[tuple[int, int]], list[int]]:
    """The words' [start, end) in ``text`` and each token's word (-1: no span)."""
    words: list[tuple[int, int]] = []
    of_token: list[int] = []
    for token, span in zip(tokens, token_spans(text, tokens), strict=True):
        if span is None:
            of_token.append(-1)
            continue
        continues = words and not token.startswith(WORD_START) and not text[words[-1][1] : span[0]]
        if continues:
            words[-1] = (words[-1][0], span[1])
        else:
            words.append(span)
        of_token.append(len(words) - 1)
    return words, of_token


def place(
    source: str,
    elements: Sequence[Element],
    source_tokens: Sequence[str],
    target: str,
    target_tokens: Sequence[str],
    alignment: Sequence[Sequence[float]],
) -> list[tuple[int, int]]:
    """Each element's [start, end) in ``target`` (the module docstring's rules)."""
    source_words, source_of = _words(source, source_tokens)
    target_words, target_of = _words(target, target_tokens)
    if not target_words:
        return [(0, 0)] * len(elements)
    hulls: list[tuple[int, int] | None] = [None] * len(elements)
    if source_words and len(alignment) == len(target_tokens):
        weights = word_weights(alignment, target_of, source_of, (len(target_words), len(source_words)))
        hulls = _hulls(elements, source_words, WordLinks(weights))
    return _resolve(source, elements, hulls, target, target_words)


def _hulls(
    elements: Sequence[Element], source_words: list[tuple[int, int]], links: WordLinks
) -> list[tuple[int, int] | None]:
    """Each element's smallest range of target words [first, last] (None: aligned to nothing)."""
    hulls: list[tuple[int, int] | None] = [None] * len(elements)
    children: dict[int, list[int]] = {}
    for index, element in enumerate(elements):
        children.setdefault(element.parent, []).append(index)
    for index in range(len(elements) - 1, -1, -1):  # children (later) before their parents
        element = elements[index]
        inside = [i for i, (s, e) in enumerate(source_words) if s < element.end and e > element.start]
        found = links.targets(inside)
        for child in children.get(index, []):
            hull = hulls[child]
            if hull is not None and hull[0] >= 0:
                found += hull
        if found:
            hulls[index] = (min(found), max(found))
        if inside and len(inside) == _words_in_parent(elements, index, source_words):
            hulls[index] = (-1, -1)  # all of its parent's words: all of its parent's range
    return hulls


def _words_in_parent(elements: Sequence[Element], index: int, source_words: list[tuple[int, int]]) -> int:
    parent = elements[index].parent
    start, end = (elements[parent].start, elements[parent].end) if parent >= 0 else (0, 1 << 62)
    return sum(1 for s, e in source_words if s < end and e > start)


def _resolve(
    source: str,
    elements: Sequence[Element],
    hulls: list[tuple[int, int] | None],
    target: str,
    target_words: list[tuple[int, int]],
) -> list[tuple[int, int]]:
    """Word hulls → character ranges inside the parent's and after the previous sibling's."""
    ranges: list[tuple[int, int]] = []
    after: dict[int, int] = {}  # parent → where its next child may start
    for index, element in enumerate(elements):
        low, high = ranges[element.parent] if element.parent >= 0 else (0, len(target))
        low = max(low, after.get(element.parent, low))
        hull = hulls[index]
        if hull == (-1, -1):
            start, end = low, high
        elif hull is None:
            start = end = low
        else:
            start, end = target_words[hull[0]][0], target_words[hull[1]][1]
            start, end = _without_punctuation(source[element.start : element.end], target, start, end)
        start = min(max(start, low), high)
        end = min(max(end, start), high)
        ranges.append((start, end))
        after[element.parent] = end
    return ranges


def _without_punctuation(source: str, target: str, start: int, end: int) -> tuple[int, int]:
    core = source.strip()
    if core and not _punctuation(core[-1]):
        while end > start and _punctuation(target[end - 1]):
            end -= 1
    if core and not _punctuation(core[0]):
        while start < end and _punctuation(target[start]):
            start += 1
    return start, end


def _punctuation(character: str) -> bool:
    return unicodedata.category(character).startswith("P")


def fill(ranges: Sequence[tuple[int, int]], sizes: Sequence[int], length: int) -> list[tuple[int, int]]:
    """Ranges of runs in order (``place``'s, of top-level elements) as a partition of
    [0, ``length``): the text between two ranges goes to the run with the most source characters
    among those from the one before it to the one after it (a paragraph's plain run, not its
    bold word), so that the runs' texts put together are the whole translation."""
    if not ranges:
        return []
    cuts = [0] * (len(ranges) + 1)  # run i gets [cuts[i], cuts[i + 1])
    cuts[-1] = length
    previous_end, previous = 0, 0
    for i, (start, end) in enumerate([*ranges, (length, length)]):
        if i < len(ranges) and start == end:
            continue  # an empty run: it takes only what a gap gives it
        candidates = range(previous, min(i, len(ranges) - 1) + 1)
        taker = max(candidates, key=lambda r: (sizes[r], -r))
        # the gap [previous_end, start) goes to ``taker``: the runs before it end at previous_end
        for r in range(previous + 1, taker + 1):
            cuts[r] = previous_end
        for r in range(taker + 1, min(i, len(ranges)) + 1):
            cuts[r] = start
        previous_end, previous = end, i
    for i in range(1, len(cuts)):
        cuts[i] = max(cuts[i], cuts[i - 1])
    return [(cuts[i], cuts[i + 1]) for i in range(len(ranges))]
