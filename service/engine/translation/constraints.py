"""Required target phrases for lexically constrained decoding (Post & Vilar 2018).

The serving layer gives each sentence the target phrases its output must hold
(``TranslateOptions.required``). Here a phrase becomes token ids — its spellings, since a
tokenizer may spell a word at the start of a sentence apart from inside one (``phrase_token_ids``)
and merge its last piece with the punctuation after it (``PhraseSpeller``) — and each beam
hypothesis carries a ``ConstraintState``: the phrases it has met and the phrase it is in the
middle of. The search (``search.SentenceSearch``) asks a sentence's
``Constraints`` which tokens move a hypothesis on, how many tokens it still needs at least, and
ranks hypotheses into banks by their progress (``progress``); the running decode
(``running.RunningDecode``) asks whether a free search's result already ``holds`` them.

Rules: each phrase is met once, in any order; one spelling of it, token for token; a phrase once
started must be continued or it is abandoned (its tokens so far count for nothing); ``</s>`` only
when every phrase is met.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from tokenizers import Tokenizer

# A spelling: the token ids of one way to write a phrase.
Spelling = tuple[int, ...]
Active = tuple[tuple[int, Spelling], ...]  # (phrase, spelling) pairs a hypothesis is in the middle of


class ConstraintUnsatisfiable(ValueError):
    """A required phrase the target vocabulary cannot spell, or that cannot fit in the sentence's
    output limit: an error for that sentence alone (→ 422)."""


_CONTEXT = "a"  # a word before the phrase, for its spelling inside a sentence


def phrase_token_ids(tokenizer: Tokenizer, phrase: str) -> list[Spelling]:
    """The spellings of ``phrase`` in the target vocabulary: as inside a sentence (after a word)
    and as at its start, where they differ (a Metaspace tokenizer marks a word start, a
    byte-level one a space before it).

    Raises ``ConstraintUnsatisfiable`` when the vocabulary cannot spell it: no tokens, an unknown
    token, or characters the tokenizer drops (its decoding loses them).
    """
    normalizer = tokenizer.normalizer  # what decoding gives back is the normalised text
    wanted = "".join((normalizer.normalize_str(phrase) if normalizer else phrase).split())
    unknown = getattr(tokenizer.model, "unk_token", None)
    if not wanted:
        raise ConstraintUnsatisfiable(f"required phrase {phrase!r} is empty")
    inside = tokenizer.encode(f"{_CONTEXT} {phrase}", add_special_tokens=False)
    kept = [i for i, (_, end) in enumerate(inside.offsets) if end > len(_CONTEXT)]
    first = tokenizer.encode(phrase, add_special_tokens=False)
    candidates = [(first.ids, first.tokens)]
    if kept and inside.offsets[kept[0]][0] >= len(_CONTEXT):  # not merged with the word before it
        candidates.insert(0, ([inside.ids[i] for i in kept], [inside.tokens[i] for i in kept]))
    spellings: list[Spelling] = []
    for ids, tokens in candidates:
        spelled = "".join(tokenizer.decode(list(ids), skip_special_tokens=False).split())
        if not ids or (unknown is not None and unknown in tokens) or spelled != wanted:
            raise ConstraintUnsatisfiable(
                f"required phrase {phrase!r} cannot be spelled with the target vocabulary"
            )
        if tuple(ids) not in spellings:
            spellings.append(tuple(ids))
    return spellings


@dataclass(frozen=True, eq=False)
class ConstraintState:
    """One hypothesis' progress: the phrases met, and the spellings it is in the middle of. Its
    ``Constraints`` makes one instance per value, so identity is equality (and hashing cheap)."""

    met: frozenset[int]
    active: Active  # the spellings that agree with the last ``at`` tokens
    at: int  # tokens of the active spellings produced so far
    matched: int  # tokens of the met phrases (their spellings as produced)
    just_met: bool = False  # the last token ended a phrase: the next may not continue its word


class Constraints:
    """One sentence's required phrases, each with its spellings, and the states of its
    hypotheses (immutable, one instance per value, what each gives worked out once)."""

    def __init__(
        self, phrases: Sequence[Sequence[Spelling]], continuing: frozenset[int] = frozenset()
    ) -> None:
        """continuing: the tokens that continue the word before them (no word start, no
        punctuation): none may follow a met phrase, so that "Drahtesel" is never met as the
        start of "Drahteselten"."""
        self.continuing = continuing
        self.phrases = [tuple(dict.fromkeys(spellings)) for spellings in phrases]
        if not self.phrases or any(not spellings or not all(spellings) for spellings in self.phrases):
            raise ValueError("every required phrase needs at least one non-empty spelling")
        self._shortest = [min(len(s) for s in spellings) for spellings in self.phrases]
        self._starts: dict[int, list[tuple[int, Spelling]]] = {}
        for p, spellings in enumerate(self.phrases):
            for spelling in spellings:
                self._starts.setdefault(spelling[0], []).append((p, spelling))
        self._interned: dict[tuple[frozenset[int], Active, int, int, bool], ConstraintState] = {}
        self.start = self._state(frozenset(), (), 0, 0, False)
        self.tokens = sorted({t for spellings in self.phrases for s in spellings for t in s})
        # What each state gives, worked out once: a beam revisits the same few states every step
        self._needed: dict[ConstraintState, int] = {}
        self._next: dict[ConstraintState, list[int]] = {}
        self._after: dict[tuple[ConstraintState, int], ConstraintState] = {}

    def _state(
        self, met: frozenset[int], active: Active, at: int, matched: int, just_met: bool
    ) -> ConstraintState:
        key = (met, active, at, matched, just_met)
        return self._interned.setdefault(key, ConstraintState(*key))

    def allows(self, state: ConstraintState, token: int) -> bool:
        """Whether ``token`` may follow ``state``: not a piece that would glue itself to a phrase
        just met."""
        return not (state.just_met and token in self.continuing)

    def __len__(self) -> int:
        return len(self.phrases)

    def done(self, state: ConstraintState) -> bool:
        return len(state.met) == len(self.phrases)

    def holds(self, tokens: Iterable[int]) -> bool:
        """Whether ``tokens`` (a result, without ``</s>``) meet every phrase as the constrained
        search would have them: each one spelled token for token, none glued to the word after it."""
        state = self.start
        for token in tokens:
            if not self.allows(state, token):
                return False
            state = self.advance(state, token)
        return self.done(state)

    def progress(self, state: ConstraintState) -> int:
        """Constraint tokens produced: the hypothesis' bank."""
        return state.matched + state.at

    def needed(self, state: ConstraintState) -> int:
        """The fewest tokens that can still meet every phrase from ``state``."""
        if (known := self._needed.get(state)) is not None:
            return known
        unmet = sum(n for p, n in enumerate(self._shortest) if p not in state.met)
        if state.active:
            unmet = min(len(s) - state.at + unmet - self._shortest[p] for p, s in state.active)
        self._needed[state] = unmet
        return unmet

    def next_tokens(self, state: ConstraintState) -> list[int]:
        """The tokens that move ``state`` on, ascending: the active spellings' next ones, else
        the first tokens of the phrases not met yet."""
        if (known := self._next.get(state)) is not None:
            return known
        if state.active:
            tokens = {s[state.at] for _, s in state.active}
        else:
            tokens = {t for t, starts in self._starts.items() if any(p not in state.met for p, _ in starts)}
        self._next[state] = sorted(tokens)
        return self._next[state]

    def advance(self, state: ConstraintState, token: int) -> ConstraintState:
        """``state`` after ``token``: the active spellings it continues go on (one that ends meets
        its phrase); if it continues none, the phrase in progress is abandoned and ``token`` may
        start another."""
        if not state.active and not state.just_met and token not in self._starts:
            return state  # most tokens: nothing in progress, nothing started
        if (known := self._after.get((state, token))) is not None:
            return known
        active = [(p, s) for p, s in state.active if s[state.at] == token]
        at = state.at + 1
        if not active:
            active = [(p, s) for p, s in self._starts.get(token, ()) if p not in state.met]
            at = 1
        ended = {p for p, s in active if len(s) == at}
        met = state.met | ended
        going = tuple((p, s) for p, s in active if p not in met)
        matched = state.matched + at * len(ended)
        after = self._state(met, going, at if going else 0, matched, bool(ended))
        self._after[(state, token)] = after
        return after


# A beam continuation: (the row it extends, its token, the row's log-prob with it).
Continuation = tuple[int, int, float]


def constrained_step(
    constraints: Constraints,
    states: Sequence[ConstraintState],
    pool: Iterable[Continuation],
    k: int,
    room: int,
    eos_id: int,
) -> tuple[list[Continuation], list[Continuation]]:
    """One step of dynamic beam allocation (Post & Vilar 2018) for a sentence's ``k`` rows in
    ``states``, from ``pool``: its best continuations and each row's constraint tokens and best
    token (duplicates allowed). ``room``: the tokens a hypothesis may still produce after this
    step's (0: this one ends it).

    A continuation is kept only if the phrases it leaves unmet still fit in ``room`` (so a
    hypothesis starts its last phrases when it must, and never ends without them), and ``</s>``
    only when every phrase is met. The kept ones are ranked into banks by constraint tokens
    produced; the k places go round the banks, most progress first, each bank's best next, so
    that hypotheses that met more phrases survive beside better-scored ones that met fewer.

    → (continuations that finish: ending with ``</s>``, or every one at ``room`` 0; the k or fewer
    that run on), each best first.
    """
    seen: set[tuple[int, int]] = set()
    banks: dict[int, list[Continuation]] = {}
    ending: dict[int, list[Continuation]] = {}
    for row, token, score in pool:
        if score == -np.inf or (row, token) in seen:
            continue
        seen.add((row, token))
        state = states[row]
        if token == eos_id:
            if constraints.done(state):
                ending.setdefault(constraints.progress(state), []).append((row, token, score))
            continue
        if not constraints.allows(state, token):
            continue
        after = constraints.advance(state, token)
        if constraints.needed(after) <= room:
            bank = constraints.progress(after)
            (ending if room == 0 else banks).setdefault(bank, []).append((row, token, score))
    every = {bank: banks.get(bank, []) + ending.get(bank, []) for bank in banks.keys() | ending.keys()}
    finishing = [c for c in _allocate(every, k) if room == 0 or c[1] == eos_id]
    return finishing, _allocate(banks, k)


def _allocate(banks: dict[int, list[Continuation]], k: int) -> list[Continuation]:
    """The k continuations the banks' round robin picks (most progress first), best first."""
    ranked = [sorted(banks[bank], key=lambda c: -c[2]) for bank in sorted(banks, reverse=True)]
    picked: list[Continuation] = []
    for rank in range(k):
        picked += [bank[rank] for bank in ranked if rank < len(bank)]
    return sorted(picked[:k], key=lambda c: -c[2])


class PhraseSpeller:
    """A target vocabulary's ``Constraints`` for sentences' required phrases, each phrase spelled
    once (the serving layer sends the same glossary terms again and again).

    Beside ``phrase_token_ids``' spellings, a phrase may end in a piece that carries punctuation
    after it ("▁Schnee." for "▁Schnee"): vocabularies merge a word with the stop after it, and a
    model that ends its sentence with the term writes that piece, not the bare word and "."."""

    def __init__(self, tokenizer: Tokenizer, cache_size: int = 4096) -> None:
        self._tokenizer = tokenizer
        self._punctuated = _punctuated_pieces(tokenizer)
        self._continuing = _continuing_pieces(tokenizer)
        self._spell = lru_cache(maxsize=cache_size)(self._spellings)
        self._placed = lru_cache(maxsize=cache_size)(self._placed_spelling)

    @property
    def continuing(self) -> frozenset[int]:
        """The tokens that would glue themselves to the word before them."""
        return self._continuing

    def placed(self, phrase: str, at_start: bool) -> Spelling:
        """``phrase``'s tokens where a search is forced through it: as at a sentence's start, or
        as inside one (placement.py)."""
        return self._placed(phrase, at_start)

    def _placed_spelling(self, phrase: str, at_start: bool) -> Spelling:
        spellings = phrase_token_ids(self._tokenizer, phrase)  # inside first, where they differ
        return spellings[-1] if at_start else spellings[0]

    def _spellings(self, phrase: str) -> tuple[Spelling, ...]:
        spellings = phrase_token_ids(self._tokenizer, phrase)
        punctuated = [(*s[:-1], t) for s in spellings for t in self._punctuated.get(s[-1], ())]
        return tuple(dict.fromkeys([*spellings, *punctuated]))

    def constraints(self, required: Sequence[str], limit: int) -> Constraints | None:
        """The constraints of a sentence that must hold ``required`` (each phrase once, however
        often named) within ``limit`` output tokens; None for none. Raises
        ``ConstraintUnsatisfiable`` for a phrase the vocabulary cannot spell or phrases that
        cannot all fit."""
        if not required:
            return None
        constraints = Constraints(
            [self._spell(phrase) for phrase in dict.fromkeys(required)], self._continuing
        )
        if constraints.needed(constraints.start) > limit:
            raise ConstraintUnsatisfiable(
                f"the required phrases take at least {constraints.needed(constraints.start)} tokens; "
                f"the output may have {limit}"
            )
        return constraints


def _punctuated_pieces(tokenizer: Tokenizer) -> dict[int, list[int]]:
    """Each token → the tokens whose piece is its piece followed by punctuation only."""
    vocab = tokenizer.get_vocab()
    punctuated: dict[int, list[int]] = {}
    for piece, token in vocab.items():
        stem = piece
        while stem and unicodedata.category(stem[-1]).startswith("P"):
            stem = stem[:-1]
        if stem != piece and stem in vocab:
            punctuated.setdefault(vocab[stem], []).append(token)
    return punctuated


def _continuing_pieces(tokenizer: Tokenizer) -> frozenset[int]:
    """The tokens that continue a word: pieces that begin with a letter or a digit, with no
    word-start mark (SentencePiece's "▁", byte-level BPE's "Ġ") and no special token."""
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    return frozenset(
        token
        for piece, token in tokenizer.get_vocab().items()
        if piece and piece not in special and piece[0].isalnum()
    )
