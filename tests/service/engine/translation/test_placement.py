"""Required phrases placed by the alignment of a free translation (placement.py): where the
words their source aligns to stood, with the free translation's tokens before them forced and
the model free after them; on made-up alignments, on a search stepped by hand, and on a tiny
exported model through OnnxTranslator."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from export.graphs.translation_layout import POSITIONS_DECODER
from service.engine.base import Encoded, TranslateItem, TranslateOptions
from service.engine.session import SessionConfig
from service.engine.translation.candidates import Candidates
from service.engine.translation.constraints import Constraints
from service.engine.translation.decoding import Decoder, DeviceBackend
from service.engine.translation.forcing import SKIPPING, Prefix, Rest
from service.engine.translation.placement import place
from service.engine.translation.restarts import Restarts
from service.engine.translation.running import PREFIX_END_WIDTH
from service.engine.translation.search import Search
from service.engine.translation.sentence_search import SentenceSearch, TokenHypothesis
from service.engine.translation.translator import OnnxTranslator
from service.engine.translation.word_alignment import source_words, target_words
from tests.service.engine.translation.test_constrained_decoding import ok, random_phrases
from tests.service.engine.translation.test_translator import TEXTS, artefact_with_layout

SOURCE = Encoded(
    ids=[10, 11, 12, 13, 14, 2],
    tokens=["▁Two", "▁dog", "s", "▁play", "▁ball.", "</s>"],
    truncated=False,
    offsets=[(0, 3), (3, 7), (7, 8), (8, 13), (13, 19), (0, 0)],
)  # "Two dogs play ball."
PIECES = ["▁Zwei", "▁Hunde", "▁spielen", "▁Ball", "."]  # 100 101 102 103 104
FREE_TOKENS = [100, 101, 102, 103, 104]


def aligned(pairs: dict[int, int]) -> np.ndarray:
    """(target pieces, source pieces) attention: each target piece on one source piece."""
    attention = np.full((len(PIECES), len(SOURCE.ids)), 0.01)
    for target, source in pairs.items():
        attention[target, source] = 1.0
    return attention


def spell(phrase: str, at_start: bool) -> tuple[int, ...]:
    return {"Köter": (200, 201), "Spielkugel": (300,)}[phrase] if not at_start else (900,)


def test_pieces_are_grouped_into_words_by_their_offsets_and_word_starts() -> None:
    assert source_words(SOURCE.tokens, SOURCE.offsets or []) == [0, 1, 1, 2, 3, -1]
    assert target_words(PIECES) == [0, 1, 2, 3, 3]
    assert target_words(["▁Schnee", "ball", "."]) == [0, 0, 0]


def test_a_phrase_takes_the_place_of_the_words_its_source_aligns_to() -> None:
    free = TokenHypothesis(FREE_TOKENS, -1.0, aligned({0: 0, 1: 1, 2: 3, 3: 4, 4: 4}))
    placed = place(free, PIECES, SOURCE, [("Spielkugel", (14, 18))], spell)
    assert placed is not None
    assert placed.prefix == (100, 101, 102, 300)  # "Zwei Hunde spielen" forced, then the phrase
    assert placed.placed == {"Spielkugel"} and placed.replaced == {103}
    both = place(free, PIECES, SOURCE, [("Spielkugel", (14, 18)), ("Köter", (4, 8))], spell)
    assert both is not None and both.prefix == (100, 200, 201, 102, 300)  # free tokens between them
    first = place(free, PIECES, SOURCE, [("Köter", (0, 3))], spell)
    assert first is not None and first.prefix == (900,)  # at the start: spelled as a sentence starts


def test_a_phrase_with_no_source_span_or_no_alignment_is_not_placed() -> None:
    free = TokenHypothesis(FREE_TOKENS, -1.0, aligned({0: 0, 1: 1, 2: 3, 3: 4, 4: 4}))
    assert place(free, PIECES, SOURCE, [("Spielkugel", None)], spell) is None
    assert place(TokenHypothesis(FREE_TOKENS, -1.0, None), PIECES, SOURCE, [("Köter", (4, 8))], spell) is None
    unencoded = Encoded(SOURCE.ids, SOURCE.tokens, False)  # no offsets kept
    assert place(free, PIECES, unencoded, [("Köter", (4, 8))], spell) is None
    # two phrases on one target word: side by side in their sources' order, over both runs
    free = TokenHypothesis(FREE_TOKENS, -1.0, aligned({0: 0, 1: 1, 2: 3, 3: 4, 4: 4}))
    placed = place(free, PIECES, SOURCE, [("Köter", (4, 8)), ("Spielkugel", (4, 13))], spell)
    assert placed is not None and placed.placed == {"Köter", "Spielkugel"}
    assert placed.prefix == (100, 200, 201, 300)  # "Zwei", then both over "Hunde spielen"
    assert placed.replaced == {101, 102}


def test_a_prefix_is_forced_and_scored_then_the_words_it_replaced_are_barred() -> None:
    """Forced tokens whatever the scores, each scored by its log-prob, on one row that becomes
    the beam after them; then the barred tokens are never taken (unless nothing else is left)."""
    vocab, eos = 8, 1
    search = SentenceSearch(0, beam_size=2, max_len=10, prefix=Prefix((5, 6), frozenset({3}), frozenset({4})))
    step = np.log(np.full((2, vocab), 1 / vocab))
    for token in (5, 6):
        assert search.k == 1 and search.wanted() == [[token]]
        continuations = search.forced(0, step)
        assert continuations is not None and [c[1] for c in continuations] == [token]
        search.advance(continuations, None, eos)
    assert search.k == 2 and search.scores[1] == -np.inf
    assert search.history[0].tolist() == [5, 6] and search.scores[0] == pytest.approx(2 * np.log(1 / vocab))
    assert search.forced(0, step) is None
    barred = [(0, 3, -1.0), (0, 4, -1.5), (0, 7, -2.0), (0, 2, -2.5)]  # 3 right after only, 4 always
    search.advance(barred, None, eos)
    assert sorted(search.history[:, -1].tolist()) == [2, 7]
    search.advance([(0, 4, -3.0), (0, 3, -3.5), (1, eos, -4.0)], None, eos)
    assert search.history[0, -1] == 3


def test_after_a_prefix_the_next_word_comes_from_the_wide_steps_candidates() -> None:
    """After a placed word the model does not know, its best few continuations all glue onto it
    (pieces without ``▁``): the search then takes its first candidate that starts a new word, from
    every candidate the wide step gave, never a glued one."""
    eos, glue = 1, frozenset(range(10, 30))
    search = Search(bos_id=0, eos_id=eos)
    sentence = SentenceSearch(0, beam_size=2, max_len=10, prefix=Prefix((5,), glue))
    search.extend([sentence])
    forced = Candidates(np.zeros((1, 4), np.float32), np.full((1, 4), 5), np.zeros((1, 1), np.float32))
    search.advance(forced, None)
    assert sentence.at_prefix_end and sentence.history[0].tolist() == [5]
    ranked = [*range(10, 30), 7, 8, 9]  # twenty glue pieces first, then word starts
    scores = -np.arange(len(ranked), dtype=np.float32) / 10
    wide = Candidates(np.tile(scores, (2, 1)), np.tile(ranked, (2, 1)))
    search.advance(wide, None)
    assert not sentence.at_prefix_end
    assert sorted(sentence.history[:, -1].tolist()) == [7, 8]  # the beam's two best word starts


def rest(tokens: tuple[int, ...], source_len: int = 3) -> Rest:
    """A free translation's rest with each token's log-prob -0.1 (then its </s>'s, -0.5) and
    its attention on source token i % ``source_len``."""
    log_probs = np.array([-0.1] * len(tokens) + [-0.5])
    return Rest(tokens, log_probs, np.eye(source_len)[np.arange(len(tokens)) % source_len])


def test_a_row_rejoins_the_rest_on_a_token_where_it_comes_or_two_further_on() -> None:
    assert SKIPPING == 2
    r = rest((20, 21, 22, 23, 21, 22))
    assert r.after([20]) == 1  # the next free token, at once
    assert r.after([7, 20]) == 1  # a word of its own, then the rest from its start
    assert r.after([7, 21]) == 2  # a word of its own in place of the rest's first
    assert r.after([7, 8, 22]) == 3
    assert r.after([21]) is None  # one token further on: 20 skipped on a single token's word
    assert r.after([20, 22]) is None and r.after([9, 9, 9]) is None
    assert r.after([22, 23]) == 4  # two tokens in a row further on: 20 and 21 left out


def test_a_row_back_on_the_free_rest_after_a_term_finishes_with_it() -> None:
    """After the placed term, once the best row is back on the rest (``Rest.after``), the
    sentence is done: its result is the row's tokens, then the rest's others, scored
    and aligned as the free search had them."""
    eos, vocab = 1, 32
    prefix = Prefix((5, 6), banned=frozenset({4}), rest=rest((20, 21, 22, 23)))
    search = SentenceSearch(0, beam_size=2, max_len=12, prefix=prefix, source_len=3)
    step = np.log(np.full((2, vocab), 1 / vocab))
    attention = np.full((2, 3), 1 / 3)
    for _ in range(2):  # the prefix, one row
        continuations = search.forced(0, step)
        assert continuations is not None
        search.advance(continuations, attention[:1], eos)
    written = search.scores[0]
    assert search.advance([(0, 9, written - 1.0), (0, 20, written - 2.0)], attention, eos) is not None
    assert not search.done  # a word of its own: not on the rest
    best = search.scores[0]
    assert search.advance([(0, 21, best - 1.0), (1, 22, best - 3.0)], attention, eos) is None
    assert search.done
    (result,) = search.results()
    assert result.tokens == [5, 6, 9, 21, 22, 23]
    logprob = best - 1.0 + 2 * -0.1 - 0.5  # the row's, then 22 and 23 and </s> as the free search scored them
    assert result.score == pytest.approx(logprob / 7)
    assert result.alignment is not None and result.alignment.shape == (6, 3)
    np.testing.assert_allclose(result.alignment[4:], np.eye(3)[[2, 0]])  # the rest's own
    assert result.token_log_probs is not None
    np.testing.assert_allclose(result.token_log_probs[4:], [-0.1, -0.1, -0.5])


def test_a_row_does_not_rejoin_the_rest_over_a_barred_word_or_for_several_results() -> None:
    eos, vocab = 1, 32
    step = np.log(np.full((2, vocab), 1 / vocab))
    for prefix, n_best in (
        (Prefix((5,), banned=frozenset({23}), rest=rest((20, 21, 22, 23))), 1),
        (Prefix((5,), rest=rest((20, 21, 22, 23))), 2),
    ):
        search = SentenceSearch(0, beam_size=2, max_len=12, n_best=n_best, prefix=prefix, source_len=3)
        continuations = search.forced(0, step)
        assert continuations is not None
        search.advance(continuations, np.ones((1, 3)), eos)
        for token in (20, 21, 22):
            score = float(search.scores[0])
            search.advance([(0, token, score - 1.0), (0, 9, score - 2.0)], np.ones((2, 3)), eos)
            assert not search.done


def test_a_placed_tail_stops_once_its_one_result_beats_every_running_row() -> None:
    """Past its prefix, a sentence of one result that may rejoin its rest stops as soon as a
    finished hypothesis beats the running rows, not once the beam has finished as many."""
    eos, vocab = 1, 32
    prefix = Prefix((5,), rest=rest((20, 21)))
    search = SentenceSearch(0, beam_size=3, max_len=12, prefix=prefix, source_len=3)
    continuations = search.forced(0, np.log(np.full((1, vocab), 1 / vocab)))
    assert continuations is not None
    search.advance(continuations, np.ones((1, 3)), eos)
    score = float(search.scores[0])
    ended = [(0, eos, score - 0.1), (0, 9, score - 5.0), (0, 8, score - 6.0), (0, 7, score - 7.0)]
    assert search.advance(ended, np.ones((3, 3)), eos) is None
    assert [h.tokens for h in search.results()] == [[5]]


def test_a_resumed_search_starts_with_its_tokens_written_and_its_phrases_met() -> None:
    """``resume``: the tokens a placed search's row already holds are its history, scored and
    aligned as given, and a required phrase among them counts as met (else the constrained
    search would write it again)."""
    constraints = Constraints([[(8,)], [(30,)]])
    prefix = Prefix((7, 8, 9, 20))
    search = SentenceSearch(0, beam_size=2, max_len=12, prefix=prefix, constraints=constraints, source_len=3)
    search.resume([7, 8], np.array([-0.5, -0.25]), np.eye(3)[:2])
    assert search.steps == 2 and search.k == 1 and search.history.tolist() == [[7, 8]]
    assert search.scores.tolist() == [-0.75] and search.wanted()[0] == [9]
    assert search.attention is not None and search.attention.shape == (1, 2, 3)
    assert search.states == [constraints.advance(constraints.advance(constraints.start, 7), 8)]
    assert constraints.next_tokens(search.states[0]) == [30]  # 8 is met: only 30 is left
    with pytest.raises(ValueError):
        search.resume([7], np.zeros(1), None)  # started already


@pytest.fixture(scope="module")
def translator(translation_artefact: Path) -> OnnxTranslator:
    return OnnxTranslator(translation_artefact, SessionConfig("cpu", 1))


def placed_count(engine: OnnxTranslator) -> float:
    labels = {"model": engine.name, "search": "placed"}
    return REGISTRY.get_sample_value("tserve_constrained_sentences_total", labels) or 0.0


def test_a_term_the_model_does_not_write_goes_where_its_source_word_aligned(
    translator: OnnxTranslator,
) -> None:
    """A phrase of the target vocabulary no free translation holds, for each sentence's second
    source word: the result is forced through the free translation's tokens up to the words that
    source word aligned to, then the term; the same alone and in a batch."""
    assert translator._can_align  # the tiny model is exported with its alignments
    frees = [ok(r).hypotheses[0].text for r in translator.translate([TranslateItem(t) for t in TEXTS])]
    term = next(p for p in random_phrases(translator, 20, seed=7) if not any(p in f for f in frees))
    before = placed_count(translator)
    items, plans = [], []
    for text in TEXTS:
        word = text.split()[min(1, len(text.split()) - 1)]
        span = (text.index(word), text.index(word) + len(word))
        free = ok(
            translator.translate([TranslateItem(text, TranslateOptions(alignments=True))])[0]
        ).hypotheses[0]
        ids = [translator.tokenizer.token_to_id(t) for t in free.tokens]
        assert term not in free.text
        source = translator.encode([text])[0]
        hypothesis = TokenHypothesis(ids, free.score, np.asarray(free.alignment))
        plans.append(place(hypothesis, free.tokens, source, [(term, span)], translator.speller.placed))
        items.append(TranslateItem(text, TranslateOptions(required=(term,), required_sources=(span,))))
    alone = [ok(translator.translate([item])[0]) for item in items]
    together = translator.translate(items)
    for result, batched, plan in zip(alone, together, plans, strict=True):
        best = result.hypotheses[0]
        assert "".join(term.split()) in "".join(best.text.split())
        assert ok(batched).hypotheses[0].tokens == best.tokens
        if plan is not None:
            ids = [translator.tokenizer.token_to_id(t) for t in best.tokens]
            assert tuple(ids[: len(plan.prefix)]) == plan.prefix
    assert placed_count(translator) - before == 2 * sum(p is not None for p in plans) > 0


def test_the_step_where_a_placed_term_ends_is_wide(
    translator: OnnxTranslator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decoder is asked for ``PREFIX_END_WIDTH`` candidates on the step after a placed term,
    and for its rows' 2·k on the others (one row while the prefix is forced, then the beam)."""
    item = placed_items(translator)[0]
    widths: list[int] = []
    step = Decoder.step_candidates

    def recorded(self: Decoder, last: np.ndarray, n: int, wanted: np.ndarray | None = None) -> Any:
        widths.append(n)
        return step(self, last, n, wanted)

    monkeypatch.setattr(Decoder, "step_candidates", recorded)
    ok(translator.translate([item])[0])
    wide = min(PREFIX_END_WIDTH, translator.manifest.vocab_size)
    assert widths.count(wide) == 1 and set(widths) == {wide, 2, 2 * item.options.beam_size}


def placed_items(engine: OnnxTranslator) -> list[TranslateItem]:
    """Each of ``TEXTS`` with a phrase no free translation holds on its first word, beam 3."""
    frees = [ok(r).hypotheses[0].text for r in engine.translate([TranslateItem(t) for t in TEXTS])]
    term = next(p for p in random_phrases(engine, 20, seed=11) if not any(p in f for f in frees))
    options = [TranslateOptions(beam_size=3, n_best=2, required=(term,), required_sources=((0, 1),))]
    return [TranslateItem(text, options[0]) for text in TEXTS]


def test_a_placed_search_starts_on_what_its_free_search_kept(
    translator: OnnxTranslator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sentence that searches again with its term placed starts on its free search's encoder
    output (the encoder runs once for it) and after the free tokens before the term, on the
    cache of the row its free translation ended on (fewer decoder rows): the same results as
    running both again."""
    items = [replace(item, options=replace(item.options, n_best=1)) for item in placed_items(translator)]
    encoded: list[int] = []
    rows: list[int] = []
    backend, step = type(translator.backend), Decoder.step_candidates
    encode = backend.encode

    def counted(self: Any, input_ids: np.ndarray) -> Any:
        encoded.append(len(input_ids))
        return encode(self, input_ids)

    def stepped(self: Decoder, last: np.ndarray, n: int, wanted: np.ndarray | None = None) -> Any:
        rows.append(len(last))
        return step(self, last, n, wanted)

    resumed: list[int] = []
    resume = SentenceSearch.resume

    def resumed_at(self: SentenceSearch, tokens: list[int], *args: Any) -> None:
        resumed.append(len(tokens))
        resume(self, tokens, *args)

    monkeypatch.setattr(backend, "encode", counted)
    monkeypatch.setattr(Decoder, "step_candidates", stepped)
    monkeypatch.setattr(SentenceSearch, "resume", resumed_at)
    kept = translator.translate(items)
    assert sum(encoded) == len(items)
    assert resumed, resumed
    kept_rows, rows[:], encoded[:] = sum(rows), [], []
    monkeypatch.setattr(Restarts, "keep", lambda *_: None)
    again = translator.translate(items)
    assert sum(encoded) > len(items)  # they did start again
    assert sum(rows) > kept_rows
    for got, want in zip(kept, again, strict=True):
        assert ok(got).hypotheses[0].tokens == ok(want).hypotheses[0].tokens
        assert ok(got).hypotheses[0].score == pytest.approx(ok(want).hypotheses[0].score, rel=1e-5)


def test_placed_sentences_beside_free_ones_decode_as_alone_on_every_layout(
    translator: OnnxTranslator, translation_checkpoint: Path, tmp_path: Path
) -> None:
    """A forced prefix's one row grows into a beam in the middle of a batch of free sentences:
    every sentence's hypotheses are its own alone, on the slot layout and on the positions
    layout (the CUDA code path run on the CPU, and the host backend)."""
    placed = placed_items(translator)
    free = [TranslateItem(text, TranslateOptions(beam_size=3, n_best=2)) for text in TEXTS]
    mixed = [item for pair in zip(free, placed, strict=True) for item in pair]
    alone = [ok(translator.translate([item])[0]) for item in mixed]
    positions = artefact_with_layout(translation_checkpoint, tmp_path / "positions", POSITIONS_DECODER)
    device = OnnxTranslator(positions, SessionConfig("cpu", 1), io_binding=True)
    assert isinstance(device.backend, DeviceBackend)
    host = OnnxTranslator(positions, SessionConfig("cpu", 1))
    for engine in (translator, device, host):
        for got, want in zip(engine.translate(mixed), alone, strict=True):
            assert [h.tokens for h in ok(got).hypotheses] == [h.tokens for h in want.hypotheses]
            np.testing.assert_allclose(
                [h.score for h in ok(got).hypotheses], [h.score for h in want.hypotheses], rtol=1e-4
            )
