"""What a placed search is forced through (``Prefix``) and the free translation it may go back
to after the last placed phrase (``Rest``): placement.py places the phrases, running.py starts
the search, sentence_search.py steps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Tokens a row must have written in a row that the rest has, after skipping some of its tokens:
# one token is ambiguous (a comma written at once is not the rest's comma three words on)
SKIPPING = 2


@dataclass(frozen=True, eq=False)
class Rest:
    """The free translation's tokens after the last placed term, each one's log-prob there
    (then its </s>'s) and cross-attention."""

    tokens: tuple[int, ...]
    log_probs: np.ndarray  # (len(tokens) + 1,)
    alignment: np.ndarray  # (len(tokens), S)

    def after(self, written: list[int]) -> int | None:
        """Where the rest goes on after ``written`` (the tokens a row wrote after the term), if
        it has come back to it: its last token where the rest has it with none of the rest's
        skipped (as many written as taken), or its last ``SKIPPING`` tokens where the rest has
        them first (a word the term already said left out); else None."""
        for at in range(1, min(len(written), len(self.tokens)) + 1):
            if self.tokens[at - 1] == written[-1]:
                return at
        last = tuple(written[-SKIPPING:])
        if len(last) == SKIPPING:
            for at in range(SKIPPING, len(self.tokens) + 1):
                if self.tokens[at - SKIPPING : at] == last:
                    return at
        return None


@dataclass(frozen=True)
class Prefix:
    """Tokens a hypothesis is forced through after its forced first token, scored by the model
    (a glossary term placed in a free translation: placement.py); ``not_after``: the tokens
    that may not follow the last one (pieces that would glue themselves to its word);
    ``banned``: tokens that may not follow it at all (the words a placed term replaced);
    ``rest``: the free translation after the last placed term (``SentenceSearch._rejoined``)."""

    tokens: tuple[int, ...]
    not_after: frozenset[int] = frozenset()
    banned: frozenset[int] = frozenset()
    rest: Rest | None = None

    def rejoined_at(self, written: list[int], room: int) -> int | None:
        """Where ``rest`` goes on after ``written`` (``Rest.after``), if what is left of it fits
        in ``room`` tokens and holds no barred one; else None."""
        at = None if self.rest is None else self.rest.after(written)
        if at is None or self.rest is None or len(self.rest.tokens) - at > room:
            return None
        return None if self.banned.intersection(self.rest.tokens[at:]) else at

    def allowed(self, candidates: list[tuple[int, int, float]], at: int) -> list[tuple[int, int, float]]:
        """The ``candidates`` (row, token, score) of the step ``at`` tokens after the forced
        first one that may be taken (all of them rather than none)."""
        if at < len(self.tokens):
            return candidates
        barred = self.banned | self.not_after if at == len(self.tokens) else self.banned
        return [c for c in candidates if c[1] not in barred] or candidates
