"""A glossary's source terms found in a sentence, and the target terms its translation must hold.

All entries of a glossary are compiled into two alternations (case-sensitive entries, and the
others with ``re.IGNORECASE``), each tried at every position of the sentence through a
lookahead, so a sentence is scanned twice whatever the number of entries. Longer terms come
first in each alternation: at one position the longest term matches. Among overlapping matches
the longest wins (then the earlier); every match that does not overlap a chosen one is kept.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from service.glossaries.entries import Entry


@dataclass(frozen=True)
class Match:
    start: int
    end: int
    entry: Entry


class TermMatcher:
    def __init__(self, entries: Sequence[Entry]) -> None:
        by_length = sorted(entries, key=lambda e: len(e.source), reverse=True)
        self._sensitive = _Alternation([e for e in by_length if e.case_sensitive], 0)
        self._insensitive = _Alternation([e for e in by_length if not e.case_sensitive], re.IGNORECASE)

    def matches(self, sentence: str) -> list[Match]:
        """The chosen matches in ``sentence``, in the order they appear."""
        found = [*self._sensitive.matches(sentence), *self._insensitive.matches(sentence)]
        found.sort(key=lambda m: (-(m.end - m.start), m.start))
        taken: list[Match] = []
        for match in found:
            if all(match.end <= t.start or match.start >= t.end for t in taken):
                taken.append(match)
        return sorted(taken, key=lambda m: m.start)

    def required(self, sentence: str) -> tuple[str, ...]:
        """The target terms of the matches in ``sentence``, each once, in order of appearance."""
        return tuple(dict.fromkeys(m.entry.target for m in self.matches(sentence)))


class _Alternation:
    """One group per entry inside a lookahead: ``lastindex`` says which entry matched."""

    def __init__(self, entries: list[Entry], flags: int) -> None:
        self._entries = entries
        alternatives = "|".join(f"({_pattern(e)})" for e in entries)
        self._regex = re.compile(f"(?=(?:{alternatives}))", flags) if entries else None

    def matches(self, sentence: str) -> list[Match]:
        if self._regex is None:
            return []
        out = []
        for found in self._regex.finditer(sentence):
            group = found.lastindex
            assert group is not None  # the lookahead matched one alternative
            out.append(Match(found.start(group), found.end(group), self._entries[group - 1]))
        return out


def _pattern(entry: Entry) -> str:
    term = re.escape(entry.source)
    return rf"(?<!\w){term}(?!\w)" if entry.whole_word else term
