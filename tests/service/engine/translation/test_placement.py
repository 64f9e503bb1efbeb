"""Required phrases placed by the alignment of a free translation (placement.py): where the
words their source aligns to stood, with the free translation's tokens before them forced and
the model free after them; on made-up alignments, on a search stepped by hand, and on a tiny
exported model through OnnxTranslator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from export.graphs.translation_layout import POSITIONS_DECODER
from service.engine.base import Encoded, TranslateItem, TranslateOptions
from service.engine.session import SessionConfig
from service.engine.translation.decoding import Decoder, DeviceBackend
from service.engine.translation.placement import place
from service.engine.translation.running import PREFIX_END_WIDTH
from service.engine.translation.search import Candidates, Search
from service.engine.translation.sentence_search import Prefix, SentenceSearch, TokenHypothesis
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
