"""A glossary's source terms found in a sentence, and the target terms its translation must hold.

The entries are kept in two character tries (case-sensitive entries as written, the others with
each character lower-cased): a sentence is walked once from each position, so matching costs
the sentence's length times the longest term, whatever the number of entries (10,000 entries:
a few hundred microseconds a sentence, where one regular expression of them all took seconds).
At one position the longest term that matches is taken; among overlapping matches the longest
wins (then the earlier), and every match that does not overlap a chosen one is kept.

Whole words: no word character (letters, digits, ``_``) right before or after the term, as
``\\b`` would say for a term that begins and ends with one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.glossaries.entries import Entry

_END = ""  # a trie node's key for the entry ending there (no character is the empty string)


@dataclass(frozen=True)
class Match:
    start: int
    end: int
    entry: Entry


def _exact(c: str) -> str:
    return c


def _folded(c: str) -> str:
    lower = c.lower()
    return lower if len(lower) == 1 else c  # one character for one, so offsets stay the sentence's


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


class _Trie:
    def __init__(self, entries: Sequence[Entry], fold: Callable[[str], str]) -> None:
        self.fold = fold
        self.root: dict[str, Any] = {}
        for entry in entries:
            node = self.root
            for c in entry.source:
                node = node.setdefault(fold(c), {})
            node.setdefault(_END, entry)  # the first of equal terms

    def longest_at(self, sentence: str, start: int) -> Match | None:
        """The longest term matching at ``start`` whose word boundaries hold."""
        left_is_word = start > 0 and _is_word(sentence[start - 1])
        node, found = self.root, None
        for end in range(start, len(sentence)):
            child: dict[str, Any] | None = node.get(self.fold(sentence[end]))
            if child is None:
                break
            node = child
            entry: Entry | None = node.get(_END)
            if entry is not None and _fits(entry, sentence, start, end + 1, left_is_word):
                found = Match(start, end + 1, entry)
        return found


def _fits(entry: Entry, sentence: str, start: int, end: int, left_is_word: bool) -> bool:
    if not entry.whole_word:
        return True
    right_is_word = end < len(sentence) and _is_word(sentence[end])
    return not (left_is_word and _is_word(sentence[start])) and not (
        right_is_word and _is_word(sentence[end - 1])
    )


class TermMatcher:
    def __init__(self, entries: Sequence[Entry]) -> None:
        self._tries = [
            _Trie([e for e in entries if e.case_sensitive], _exact),
            _Trie([e for e in entries if not e.case_sensitive], _folded),
        ]

    def matches(self, sentence: str) -> list[Match]:
        """The chosen matches in ``sentence``, in the order they appear."""
        found = [
            match
            for trie in self._tries
            if trie.root
            for start in range(len(sentence))
            if (match := trie.longest_at(sentence, start)) is not None
        ]
        found.sort(key=lambda m: (-(m.end - m.start), m.start))
        taken: list[Match] = []
        for match in found:
            if all(match.end <= t.start or match.start >= t.end for t in taken):
                taken.append(match)
        return sorted(taken, key=lambda m: m.start)
