"""Required phrases enforced by the search, on a tiny exported model (OnnxTranslator,
RunningDecode): present in every hypothesis, the same alone and in any batch, errors per item."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from export.graphs.translation_layout import POSITIONS_DECODER
from service.engine.base import TranslateItem, TranslateOptions, Translation, TranslationHypothesis
from service.engine.session import SessionConfig
from service.engine.translation.constraints import ConstraintUnsatisfiable
from service.engine.translation.decoding import DeviceBackend, HostBackend
from service.engine.translation.sentence_search import TokenHypothesis
from service.engine.translation.translator import OnnxTranslator
from tests.service.engine.translation.test_translator import TEXTS, artefact_with_layout


@pytest.fixture(scope="module")
def translator(translation_artefact: Path) -> OnnxTranslator:
    return OnnxTranslator(translation_artefact, SessionConfig("cpu", 1))


def ok(result: Translation | Exception) -> Translation:
    assert isinstance(result, Translation), result
    return result


def random_phrases(engine: OnnxTranslator, n: int, seed: int) -> list[str]:
    """Phrases of one or two random pieces of the target vocabulary, as text."""
    rng = random.Random(seed)
    vocab = engine.tokenizer._full.get_vocab()
    pieces = sorted(piece for piece in vocab if not piece.startswith("<"))
    phrases: list[str] = []
    while len(phrases) < n:
        ids = [vocab[rng.choice(pieces)] for _ in range(rng.randint(1, 2))]
        text = engine.tokenizer.decode_batch([ids])[0].strip()
        if text:
            phrases.append(text)
    return phrases


def holds(hypothesis: TranslationHypothesis, phrase: str) -> bool:
    return "".join(phrase.split()) in "".join(hypothesis.text.split())


def same(got: Translation | Exception, want: Translation | Exception) -> None:
    got_hyps, want_hyps = ok(got).hypotheses, ok(want).hypotheses
    assert [h.tokens for h in got_hyps] == [h.tokens for h in want_hyps]
    np.testing.assert_allclose([h.score for h in got_hyps], [h.score for h in want_hyps], rtol=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_every_hypothesis_holds_every_required_phrase(translator: OnnxTranslator, beam: int) -> None:
    """Random pieces of the target vocabulary, one or two per sentence: present in 100 % of the
    n-best outputs."""
    phrases = random_phrases(translator, 48, seed=beam)
    batch = [
        TranslateItem(
            TEXTS[i % len(TEXTS)],
            TranslateOptions(beam_size=beam, n_best=min(beam, 2), required=tuple(phrases[i : i + 1 + i % 2])),
        )
        for i in range(0, len(phrases), 2)
    ]
    for item, result in zip(batch, translator.translate(batch), strict=True):
        hypotheses = ok(result).hypotheses
        assert len(hypotheses) == item.options.n_best
        for h in hypotheses:
            assert all(holds(h, phrase) for phrase in item.options.required), (item.options.required, h.text)
            assert len(h.tokens) <= item.options.max_length


@pytest.mark.parametrize("beam", [1, 4])
def test_constrained_and_free_sentences_decode_alone_as_in_a_batch(
    translator: OnnxTranslator, beam: int
) -> None:
    """A free sentence's output does not change beside constrained ones (nor theirs beside it)."""
    phrases = random_phrases(translator, len(TEXTS), seed=10 + beam)
    batch = [
        TranslateItem(text, TranslateOptions(beam_size=beam, n_best=beam, required=(p,) if i % 2 else ()))
        for i, (text, p) in enumerate(zip(TEXTS, phrases, strict=True))
    ]
    free = [TranslateItem(item.text, TranslateOptions(beam_size=beam, n_best=beam)) for item in batch]
    together = translator.translate(batch)
    for i, (item, result) in enumerate(zip(batch, together, strict=True)):
        same(result, translator.translate([item])[0])
        if not item.options.required:
            same(result, translator.translate([free[i]])[0])


def decode_continuously(engine: OnnxTranslator, batch: list[TranslateItem]) -> list[list[TokenHypothesis]]:
    """The items join one running decode one by one, a step apart (the continuous executor's
    iteration-level batching)."""
    results: list[Translation | Exception | None] = [None] * len(batch)
    encoded = engine.prepare(batch, results)
    decode = engine.new_decode()
    found: dict[int, list[TokenHypothesis]] = {}
    waiting = list(range(len(batch)))
    while waiting or decode.sentences:
        if waiting:
            i = waiting.pop(0)
            found.update((s.key, s.results()) for s in decode.admit([(i, encoded[i], batch[i].options)]))
        if decode.sentences:
            found.update((s.key, s.results()) for s in decode.step())
    return [found[i] for i in range(len(batch))]


@pytest.mark.parametrize("beam", [1, 4])
def test_a_sentence_joining_a_running_decode_keeps_its_own_constraints(
    translator: OnnxTranslator, beam: int
) -> None:
    phrases = random_phrases(translator, len(TEXTS), seed=20 + beam)
    batch = [
        TranslateItem(text, TranslateOptions(beam_size=beam, required=(p,) if i != 1 else ()))
        for i, (text, p) in enumerate(zip(TEXTS, phrases, strict=True))
    ]
    whole = translator.translate(batch)
    for hyps, result in zip(decode_continuously(translator, batch), whole, strict=True):
        assert [translator.tokenizer.id_to_tokens(h.tokens) for h in hyps] == [
            h.tokens for h in ok(result).hypotheses
        ]


def test_a_phrase_the_vocabulary_cannot_spell_fails_its_sentence_alone(translator: OnnxTranslator) -> None:
    batch = [
        TranslateItem(TEXTS[0], TranslateOptions(required=("中文",))),
        TranslateItem(TEXTS[1], TranslateOptions(required=("cat",))),
        TranslateItem(TEXTS[2]),
    ]
    bad, good, free = translator.translate(batch)
    assert isinstance(bad, ConstraintUnsatisfiable) and "中文" in str(bad)
    assert all(holds(h, "cat") for h in ok(good).hypotheses)
    same(free, translator.translate(batch[2:])[0])


def test_phrases_that_cannot_fit_in_the_output_limit_are_unsatisfiable(translator: OnnxTranslator) -> None:
    """Phrases needing more tokens than max_length fail (no cut phrase); phrases that fill it
    exactly are the whole output."""
    phrase = "small street"
    spellings = translator.speller._spell(phrase)
    ids = min(spellings, key=len)
    short, exact = translator.translate(
        [
            TranslateItem(TEXTS[0], TranslateOptions(max_length=len(ids) - 1, required=(phrase,))),
            TranslateItem(TEXTS[0], TranslateOptions(beam_size=2, max_length=len(ids), required=(phrase,))),
        ]
    )
    assert isinstance(short, ConstraintUnsatisfiable)
    spelled = [translator.tokenizer.id_to_tokens(list(s)) for s in spellings if len(s) == len(ids)]
    assert ok(exact).hypotheses and all(h.tokens in spelled for h in ok(exact).hypotheses)


def test_alignments_cover_every_output_token(translator: OnnxTranslator) -> None:
    (result,) = translator.translate(
        [TranslateItem(TEXTS[2], TranslateOptions(beam_size=3, alignments=True, required=("dogs",)))]
    )
    h = ok(result).hypotheses[0]
    assert h.alignment is not None and len(h.alignment) == len(h.tokens)
    assert all(len(row) == ok(result).n_input_tokens for row in h.alignment)
    np.testing.assert_allclose([sum(row) for row in h.alignment], 1.0, rtol=1e-4)


def test_the_device_backend_and_the_positions_layout_enforce_the_same(
    translator: OnnxTranslator, translation_checkpoint: Path, tmp_path: Path
) -> None:
    """The CUDA code path (IO binding, the positions layout) run on CPU, and the positions layout
    on the host backend, give the slot layout's constrained hypotheses."""
    positions = artefact_with_layout(translation_checkpoint, tmp_path / "positions", POSITIONS_DECODER)
    device = OnnxTranslator(positions, SessionConfig("cpu", 1), io_binding=True)
    host = OnnxTranslator(positions, SessionConfig("cpu", 1))
    assert isinstance(device.backend, DeviceBackend) and isinstance(host.backend, HostBackend)
    phrases = random_phrases(translator, len(TEXTS), seed=30)
    batch = [
        TranslateItem(text, TranslateOptions(beam_size=3, n_best=2, required=(p,)))
        for text, p in zip(TEXTS, phrases, strict=True)
    ]
    want = translator.translate(batch)
    for engine in (device, host):
        for got, expected in zip(engine.translate(batch), want, strict=True):
            same(got, expected)


def test_a_shortlist_decode_keeps_the_constraint_tokens(shortlist_artefact: Path) -> None:
    engine = OnnxTranslator(shortlist_artefact, SessionConfig("cpu", 1), shortlist=True)
    batch = [TranslateItem(text, TranslateOptions(beam_size=2, required=("bike",))) for text in TEXTS[1:4]]
    for result in engine.translate(batch):
        assert all(holds(h, "bike") for h in ok(result).hypotheses)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_free_result_that_holds_every_phrase_is_the_result(translator: OnnxTranslator, beam: int) -> None:
    """Required words the free search writes anyway change nothing: its result stands (the
    constrained search, splitting its beam by the phrases met, would often find a worse one);
    a word it does not write sends the sentence to the constrained search."""
    free = translator.translate([TranslateItem(text, TranslateOptions(beam_size=beam)) for text in TEXTS])
    (absent,) = random_phrases(translator, 1, seed=50 + beam)
    counted = {search: searches(translator, search) for search in ("free", "constrained")}
    stood = 0
    for text, result in zip(TEXTS, free, strict=True):
        best = ok(result).hypotheses[0]
        ids = [translator.tokenizer.token_to_id(t) for t in best.tokens]
        for required in (tuple(best.text.split()[:2]), (absent,)):
            (constrained,) = translator.translate(
                [TranslateItem(text, TranslateOptions(beam_size=beam, required=required))]
            )
            assert all(holds(h, phrase) for h in ok(constrained).hypotheses for phrase in required)
            constraints = translator.speller.constraints(required, 64)
            if constraints is not None and constraints.holds(ids):
                same(constrained, result)
                stood += 1
            else:
                assert ok(constrained).hypotheses[0].tokens != best.tokens
    assert stood >= len(TEXTS) // 2  # most free results hold their own first words
    assert searches(translator, "free") - counted["free"] == stood
    assert searches(translator, "constrained") - counted["constrained"] == 2 * len(TEXTS) - stood


def searches(engine: OnnxTranslator, search: str) -> float:
    """The metrics' count of constrained sentences that got their result from ``search``."""
    labels = {"model": engine.name, "search": search}
    return REGISTRY.get_sample_value("tserve_constrained_sentences_total", labels) or 0.0


def test_the_best_free_hypothesis_that_holds_every_phrase_is_the_result(translator: OnnxTranslator) -> None:
    """A phrase the best free hypothesis misses but another finished one holds: that one is
    the result, without a constrained search."""
    items = [TranslateItem(text, TranslateOptions(beam_size=4, n_best=4)) for text in TEXTS]
    for item, result in zip(items, translator.translate(items), strict=True):
        best, second, *_ = ok(result).hypotheses
        ids = [translator.tokenizer.token_to_id(t) for t in best.tokens]
        for word in second.text.split():
            constraints = translator.speller.constraints((word,), 64)
            assert constraints is not None
            if not constraints.holds(ids):
                options = TranslateOptions(beam_size=4, required=(word,))
                (constrained,) = translator.translate([TranslateItem(item.text, options)])
                assert ok(constrained).hypotheses[0].tokens == second.tokens
                return
    pytest.fail("no second hypothesis has a word the best one does not")


def test_a_result_holds_every_phrase_in_each_of_its_n_best(translator: OnnxTranslator) -> None:
    """A phrase only the best free hypothesis holds sends the sentence to the constrained search,
    whose every hypothesis holds it."""
    items = [TranslateItem(text, TranslateOptions(beam_size=4, n_best=4)) for text in TEXTS]
    for item, result in zip(items, translator.translate(items), strict=True):
        best, *others = ok(result).hypotheses
        only_best = [w for w in best.text.split() if not any(w in h.text.split() for h in others)]
        if not only_best:
            continue
        options = TranslateOptions(beam_size=4, n_best=4, required=(only_best[0],))
        (constrained,) = translator.translate([TranslateItem(item.text, options)])
        assert all(holds(h, only_best[0]) for h in ok(constrained).hypotheses)
        return
    pytest.fail("no sentence has a word only its best hypothesis writes")


def test_a_sentence_waiting_to_search_again_under_its_constraints_can_leave(
    translation_checkpoint: Path, tmp_path: Path
) -> None:
    """On a decoder that admits only into an empty decode (the device backend), a sentence whose
    free search missed its phrase waits for the running ones; it counts among the decode's
    sentences and rows, leaves when abandoned, else starts once the decode empties."""
    positions = artefact_with_layout(translation_checkpoint, tmp_path / "positions", POSITIONS_DECODER)
    engine = OnnxTranslator(positions, SessionConfig("cpu", 1), io_binding=True)
    (phrase,) = random_phrases(engine, 1, seed=40)
    long = TranslateItem(TEXTS[0], TranslateOptions(beam_size=2, max_length=40))
    short = TranslateItem(TEXTS[1], TranslateOptions(beam_size=2, max_length=6, required=(phrase,)))
    results: list[Translation | Exception | None] = [None, None]
    encoded = engine.prepare([long, short], results)
    for abandon in (True, False):
        decode = engine.new_decode()
        assert not decode.decoder.joins_midway
        decode.admit([(0, encoded[0], long.options), (1, encoded[1], short.options)])
        finished: list[int] = []
        while 1 in {s.key for s in decode.search.sentences}:  # the short one's free search
            finished += [s.key for s in decode.step()]
        assert finished == [] and [s.key for s in decode.sentences] == [0, 1] and decode.rows == 4
        if abandon:
            assert [s.key for s in decode.remove(lambda s: s.key == 1)] == [1]
            assert [s.key for s in decode.sentences] == [0]
        while decode.sentences:
            finished += [s.key for s in decode.step()]
        assert finished == ([0] if abandon else [0, 1])
