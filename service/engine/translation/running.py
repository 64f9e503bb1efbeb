"""A running decode: sentences join it between decoder steps and leave it as soon as they finish.

It ties the encoder, the decoder of the artefact's layout (``decoding.Decoder``: its cache and
memory) and the per-sentence search (``search.Search``) together, for whole batches
(``OnnxTranslator.translate``) and for the continuous executor (``service/queue/continuous.py``)
alike: admitting runs the encoder on the new sentences and appends their rows; a step runs the
decoder once over every running row and moves each sentence's search on; finished sentences come
back at once. Sentences with different beam sizes, n-best, length penalties and limits share the
steps; each one's result depends only on its own rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.tokenizer import Encoded, TextTokenizer, padded_partition
from service.engine.translation.constraints import Constraints, ConstraintUnsatisfiable, PhraseSpeller
from service.engine.translation.decoding import Backend, Decoder
from service.engine.translation.forcing import Prefix, Rest
from service.engine.translation.placement import place
from service.engine.translation.restarts import Restarts
from service.engine.translation.search import Search
from service.engine.translation.sentence_search import EarlyStopping, SentenceSearch, TokenHypothesis
from service.engine.translation.shortlist import VocabularyMap
from service.metrics import CONSTRAINED_SENTENCES, labelled

# The candidates of a step where a forced prefix ends (a placed term): enough that one of them
# starts a new word, where the best few of a word the model does not know all glue onto it
PREFIX_END_WIDTH = 128
ENCODER_ROWS = 64  # sentences per encoder run at most: more gain nothing, and it bounds the cut's search


def output_limit(options: TranslateOptions, max_target_len: int) -> int:
    """The most tokens a sentence may get: its ``max_length``, within the model's positions."""
    return min(options.max_length, max_target_len)


def sentence_constraints(
    speller: PhraseSpeller | None, options: TranslateOptions, limit: int, forced_first: int | None
) -> Constraints | None:
    """The sentence's required phrases as constraints, within its output ``limit`` (less the
    forced first token, which counts in it); raises ``ConstraintUnsatisfiable`` (that sentence's
    error) when they cannot be spelled or cannot fit."""
    if not options.required:
        return None
    if speller is None:
        raise ValueError("this model's decode has no target vocabulary to spell required phrases with")
    return speller.constraints(options.required, limit - (forced_first is not None))


@dataclass(frozen=True)
class DecodeShape:
    """What sizes a running decode's memory: the model's cache geometry and limits."""

    n_layers: int
    n_heads: int
    d_head: int
    itemsize: int  # bytes per cache value (4: fp32, 2: fp16)
    vocab_size: int
    max_target_len: int
    memory_per_sentence: bool  # one memory for all of a sentence's beams (``Decoder``'s)

    def footprint(self, rows: int, sentences: int, target_len: int, source_len: int) -> int:
        """Self-attention cache of ``rows`` rows and the cross-attention memory of their
        ``sentences`` sentences (once per row where the decoder holds it per row), K and V per
        layer, twice: the slot buffers grow ahead of need (up to 1.5× the slots, 2× the history;
        engine/slots.py); a growing cache (engine/positions.py) is held as past and present at
        once by a step, and as the old and the new rows by a reorder."""
        per_position = 2 * self.n_layers * self.n_heads * self.d_head * self.itemsize
        memories = sentences if self.memory_per_sentence else rows
        return 2 * per_position * (rows * target_len + memories * source_len)


class RunningDecode:
    """Sentences decoding together on one engine's backend (not thread-safe: one driver)."""

    def __init__(
        self,
        backend: Backend,
        decoder: Decoder,  # empty, on ``backend``
        shape: DecodeShape,
        tokenizer: TextTokenizer,
        special: tuple[int, int],  # bos, eos
        can_align: bool,
        vocabulary_map: VocabularyMap | None = None,  # each sentence's shortlist
        default_forced_first: int | None = None,  # for options that force none
        early_stopping: EarlyStopping = True,  # when beam searches stop: the artefact's rule
        speller: PhraseSpeller | None = None,  # required phrases → constraints (the target vocabulary's)
        model: str = "",  # the engine's name, for the metrics
    ) -> None:
        if vocabulary_map is not None and not decoder.steps_over_shortlists:
            raise ValueError(f"{type(decoder).__name__} does not step over vocabulary shortlists")
        self.backend = backend
        self.decoder = decoder
        self.shape = shape
        self.tokenizer = tokenizer
        self.vocabulary_map = vocabulary_map
        self.default_forced_first = default_forced_first
        self.early_stopping = early_stopping
        self.speller = speller
        self.model = model
        bos_id, eos_id = special
        self.can_align = can_align
        self.search = Search(bos_id, eos_id)
        # Searches of sentences with required phrases whose results stand only if they hold them
        # (searching free first, or with phrases placed): source, options, constraints, kind
        self._checked: dict[SentenceSearch, tuple[Encoded, TranslateOptions, Constraints, str]] = {}
        # Searches of sentences whose results missed a phrase, not yet running (a decoder that
        # cannot join sentences midway takes them once the running ones are done)
        self._again: list[tuple[SentenceSearch, Encoded]] = []
        self._forcing: set[SentenceSearch] = set()  # running searches with a forced prefix
        self.restarts = Restarts(decoder)  # what sentences that search again keep of the free search

    @property
    def sentences(self) -> list[SentenceSearch]:
        """The sentences not finished: running, or waiting to start again under constraints."""
        return self.search.sentences + [s for s, _ in self._again]

    @property
    def running(self) -> int:
        """How many sentences are not finished (``sentences``, without making the list)."""
        return self.search.running + len(self._again)

    @property
    def rows(self) -> int:
        """The rows the unfinished sentences take: running, or about to (``sentences``)."""
        growing = sum(s.beam_size - s.k for s in self._forcing)  # one row that becomes a beam
        return self.decoder.rows + growing + sum(s.beam_size for s, _ in self._again)

    def can_admit(self) -> bool:
        return not self.search.running or self.decoder.joins_midway

    def limit(self, options: TranslateOptions) -> int:
        return output_limit(options, self.shape.max_target_len)

    def forced_first(self, options: TranslateOptions) -> int | None:
        return self.default_forced_first if options.forced_first_token is None else options.forced_first_token

    def worst_bytes(self, extra: Sequence[tuple[TranslateOptions, int]] = ()) -> int:
        """The most cache and memory the running rows (plus ``extra`` sentences: options, source
        tokens) can ever take: every row padded to the longest limit and the longest source."""
        running = [(s.beam_size, s.max_len, s.source_len or 0) for s in self.sentences]
        running += [(o.beam_size, self.limit(o), n) for o, n in extra]
        if not running:
            return 0
        rows = sum(k for k, _, _ in running)
        target = max(t for _, t, _ in running)
        source = max(max(n for _, _, n in running), self.decoder.source_len)
        return self.shape.footprint(rows, len(running), target, source)

    def admit(self, entries: Sequence[tuple[Any, Encoded, TranslateOptions]]) -> list[SentenceSearch]:
        """Encode ``entries`` (key, source, options) and append their rows; → those done at once
        (a limit below one token). Required phrases that cannot be met raise
        ``ConstraintUnsatisfiable`` (``OnnxTranslator.prepare`` turns them away before).

        A sentence with required phrases searches free first: the best of its finished
        hypotheses that hold every phrase are its results, if there are ``n_best`` of them;
        otherwise it starts again (``step``), with the phrases it missed where their source words
        aligned in its best free translation (placement.py), or under its constraints where none
        can be placed. The free search's hypotheses
        are the model's own choice, which a constrained search, splitting its beam between
        hypotheses by the phrases they have met, finds less often (docs/decisions.md)."""
        searches = []
        for key, source, options in entries:
            constraints = sentence_constraints(
                self.speller, options, self.limit(options), self.forced_first(options)
            )
            placing = constraints is not None and self._places(options)
            search = self._new_search(key, source, options, None, with_attention=placing)
            if constraints is not None:
                self._checked[search] = (source, options, constraints, "free")
            searches.append(search)
        self._start([(s, e[1]) for s, e in zip(searches, entries, strict=True) if not s.done])
        return [s for s in searches if s.done]

    def _places(self, options: TranslateOptions) -> bool:
        """Whether the sentence's required phrases may be placed by alignment (placement.py)."""
        return self.can_align and any(span is not None for span in options.required_sources)

    def _new_search(
        self,
        key: Any,
        source: Encoded,
        options: TranslateOptions,
        constraints: Constraints | None,
        prefix: Prefix | None = None,
        with_attention: bool = False,  # kept whether or not the options ask for alignments
    ) -> SentenceSearch:
        return SentenceSearch(
            key,
            beam_size=options.beam_size,
            max_len=self.limit(options),
            n_best=options.n_best,
            length_penalty=options.length_penalty,
            with_attention=(options.alignments or with_attention) and self.can_align,
            source_len=source.n_tokens,
            forced_first=self.forced_first(options),
            early_stopping=self.early_stopping,
            constraints=constraints,
            prefix=prefix,
        )

    def _start(self, starting: list[tuple[SentenceSearch, Encoded]]) -> None:
        """The encoder on ``starting``'s sources, their rows after the running ones."""
        starting.sort(key=lambda pair: pair[1].n_tokens)
        lengths = [source.n_tokens for _, source in starting]
        runs = [(0, len(starting))] if starting else []
        if self.decoder.joins_midway and starting:
            # room for all at once, then the encoder on the runs that pad least
            rows = self.decoder.rows + sum(s.k for s, _ in starting)
            self.decoder.reserve(rows, self.decoder.sentences + len(starting), lengths[-1])
            runs = padded_partition(lengths, ENCODER_ROWS, sys.maxsize)
        vmap = self.vocabulary_map
        for start, end in runs:
            run = starting[start:end]
            ids, mask = self.tokenizer.pad([source.ids for _, source in run])
            repeats = [s.k for s, _ in run]
            shortlists = None if vmap is None else [_shortlist(vmap, s, source) for s, source in run]
            memory = self.restarts.memory([s for s, _ in run], mask.shape[1])
            if memory is None:
                memory = self.backend.encode(ids)
                placing = [(i, s, e.n_tokens) for i, (s, e) in enumerate(run) if self._may_place(s)]
                self.restarts.keep(placing, memory)
            first = self.decoder.rows
            self.decoder.admit(memory, mask, repeats, shortlists)
            for (s, _), row in zip(run, np.cumsum([0, *repeats[:-1]]).tolist(), strict=True):
                self.restarts.start(s, first + row)
            self.search.extend([s for s, _ in run], own=self.restarts.watched)
            self._forcing.update(s for s, _ in run if s.prefix is not None)

    def _may_place(self, search: SentenceSearch) -> bool:
        """Whether ``search`` is a free-first one that may start again with phrases placed."""
        plan = self._checked.get(search)
        return plan is not None and plan[3] == "free" and self._places(plan[1])

    def step(self) -> list[SentenceSearch]:
        """One decoder step over every running row (the sentences starting again under their
        constraints join first, when the decoder can take them); → the sentences that finished."""
        if self._again and self.can_admit():
            again, self._again = self._again, []
            self._start(again)
        self.decoder.with_attention = self.search.with_attention
        width = 2 * self.search.widest_beam
        if any(s.at_prefix_end for s in self._forcing):
            width = max(width, PREFIX_END_WIDTH)
        width = min(width, self.shape.vocab_size)
        wanted = self.search.wanted_tokens()
        scores, attention = self.decoder.step_candidates(self.search.last_tokens(), width, wanted)
        first_rows = self.search.first_rows() if self.restarts.watching else {}
        rows, finished = self.search.advance(scores, attention)
        self.restarts.park_ended(first_rows)  # before their rows move
        self.decoder.reorder(rows)
        self._forcing.difference_update(finished)
        return [s for s in finished if self._stands(s)]

    def _stands(self, search: SentenceSearch) -> bool:
        """Whether a finished search's results are the sentence's: a free-first search's (or a
        placed one's) best finished hypotheses that hold every required phrase, if ``n_best`` of
        them do; else the sentence searches again, with the phrases its free translation missed
        placed by alignment (``_placed``) where it can, else under its constraints."""
        plan = self._checked.pop(search, None)
        if plan is None:
            self.restarts.forget(search)
            if search.constraints is not None:
                labelled(CONSTRAINED_SENTENCES, self.model, "constrained").inc()
            return True
        source, options, constraints, kind = plan
        best = search.results()[:1]
        if search.keep_finished(constraints.holds):
            self.restarts.forget(search)
            labelled(CONSTRAINED_SENTENCES, self.model, kind).inc()
            return True
        placed = self._placed(search.key, best, source, options, constraints) if kind == "free" else None
        if placed is None:
            again, free_tokens = self._new_search(search.key, source, options, constraints), 0
        else:
            again, free_tokens = placed
            self._checked[again] = (source, options, constraints, "placed")
        self.restarts.hand_over(search, again, best[0] if best else None, free_tokens)
        self._again.append((again, source))
        return False

    def _placed(
        self,
        key: Any,
        best: list[TokenHypothesis],
        source: Encoded,
        options: TranslateOptions,
        constraints: Constraints,
    ) -> tuple[SentenceSearch, int] | None:
        """The sentence's search forced through its best free translation with the phrases it
        missed placed by alignment (placement.py), and the phrases left constrained after them,
        and the free tokens it is forced through before the first phrase; None when none can be
        placed."""
        if not best or self.speller is None or not self._places(options):
            return None
        required = list(dict.fromkeys(options.required))  # ``constraints``' phrases, in order
        spans: dict[str, tuple[int, int] | None] = {}
        for phrase, span in zip(options.required, options.required_sources, strict=False):
            spans.setdefault(phrase, span)
        missing = [(p, spans.get(p)) for p in required if not self._holds(p, best[0].tokens)]
        pieces = self.tokenizer.id_to_tokens(best[0].tokens)
        placement = place(best[0], pieces, source, missing, self.speller.placed)
        room = self.limit(options) - (self.forced_first(options) is not None)
        if placement is None or len(placement.prefix) >= room:
            return None
        left = [p for p in required if p not in placement.placed]
        try:
            after = self.speller.constraints(left, room - len(placement.prefix))  # they come after it
        except ConstraintUnsatisfiable:
            return None
        kept = frozenset() if after is None else frozenset(after.tokens)  # what the phrases left need
        rest = _rest(best[0], placement.rest_from) if after is None else None
        prefix = Prefix(placement.prefix, self.speller.continuing, placement.replaced - kept, rest)
        return self._new_search(key, source, options, after, prefix), placement.first_at

    def _holds(self, phrase: str, tokens: list[int]) -> bool:
        """Whether ``tokens`` hold ``phrase`` as the constrained search would have it."""
        assert self.speller is not None
        constraints = self.speller.constraints([phrase], 1 << 20)
        return constraints is not None and constraints.holds(tokens)

    def remove(self, gone: Callable[[SentenceSearch], bool]) -> list[SentenceSearch]:
        """Take the sentences ``gone`` flags out of the running decode at once (their rows free)."""
        removed = [s for s in self.search.sentences if gone(s)]
        if removed:
            self.decoder.reorder(self.search.remove(gone))
        for s in removed:
            self._checked.pop(s, None)
            self._forcing.discard(s)
            self.restarts.forget(s)
        kept: list[tuple[SentenceSearch, Encoded]] = []
        left: list[tuple[SentenceSearch, Encoded]] = []
        for entry in self._again:  # not running yet: nothing to reorder
            (left if gone(entry[0]) else kept).append(entry)
        self._again = kept
        for s, _ in left:
            self._checked.pop(s, None)
            self.restarts.forget(s)
        return removed + [s for s, _ in left]


def _rest(free: TokenHypothesis, start: int) -> Rest | None:
    """``free``'s tokens from ``start`` on, when it ended with </s> and kept its log-probs."""
    log_probs, alignment = free.token_log_probs, free.alignment
    if log_probs is None or alignment is None or len(log_probs) != len(free.tokens) + 1:
        return None
    return Rest(tuple(free.tokens[start:]), log_probs[start:], alignment[start:])


def _shortlist(vmap: VocabularyMap, search: SentenceSearch, source: Encoded) -> np.ndarray:
    """A sentence's shortlist: what its source's tokens map to, its constraint tokens and its
    forced prefix."""
    ids = vmap.shortlist(source.tokens)
    if search.constraints is not None:
        ids = np.union1d(ids, search.constraints.tokens)
    return ids if search.prefix is None else np.union1d(ids, search.prefix.tokens)


class ContinuousEngine(Protocol):
    """What the continuous executor needs of a translation engine (``OnnxTranslator``)."""

    name: str
    max_decode_rows: int  # sentences × beams at once

    def new_decode(self) -> RunningDecode: ...

    def prepare(
        self, items: Sequence[TranslateItem], results: list[Translation | Exception | None]
    ) -> dict[int, Encoded]: ...

    def finish(
        self,
        items: Sequence[TranslateItem],
        todo: dict[int, Encoded],
        hyps: dict[int, list[TokenHypothesis]],
        results: list[Translation | Exception | None],
    ) -> None: ...
