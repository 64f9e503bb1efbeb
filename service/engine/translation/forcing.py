"""What a placed search is forced through (``Prefix``) and the free translation it may go back
to after the last placed phrase (``Rest``): placement.py places the phrases, running.py starts
the search, sentence_search.py steps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The tokens in a row of a placed term's free rest after which a search takes the rest as it was
REJOIN = 1


@dataclass(frozen=True, eq=False)
class Rest:
    """The free translation's tokens after the last placed term, each one's log-prob there
    (then its </s>'s) and cross-attention."""

    tokens: tuple[int, ...]
    log_probs: np.ndarray  # (len(tokens) + 1,)
    alignment: np.ndarray  # (len(tokens), S)

    def after(self, written: list[int]) -> int | None:
        """Where the rest goes on after ``written`` (the tokens a row wrote after the term):
        after the first place its last ``REJOIN`` tokens are in it, if that place skips none of
        its tokens (as many written as taken), else None: a comma written at once does not
        join the rest at its comma three words on."""
        n = REJOIN
        tail = tuple(written[-n:])
        for at in range(n, min(len(written), len(self.tokens)) + 1):
            if self.tokens[at - n : at] == tail:
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

    def allowed(self, candidates: list[tuple[int, int, float]], at: int) -> list[tuple[int, int, float]]:
        """The ``candidates`` (row, token, score) of the step ``at`` tokens after the forced
        first one that may be taken (all of them rather than none)."""
        if at < len(self.tokens):
            return candidates
        barred = self.banned | self.not_after if at == len(self.tokens) else self.banned
        return [c for c in candidates if c[1] not in barred] or candidates
