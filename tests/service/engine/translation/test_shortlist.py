"""Vocabulary shortlists: the map (CTranslate2's vmap format), the step's union and masks, and an
engine decoding over them."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from service.artefacts import ArtefactError
from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.session import SessionConfig
from service.engine.translation.shortlist import StepVocabulary, VocabularyMap
from service.engine.translation.translator import OnnxTranslator

IDS = {"▁a": 10, "▁man": 11, "▁rides": 12, "▁ein": 20, "▁Mann": 21, "▁fährt": 22, ".": 5}
TEXTS = ["a man rides a bike", "two dogs run", "a small cat sits on the big red street", "red"]


def read_map(tmp_path: Path, text: str) -> VocabularyMap:
    path = tmp_path / "vmap.txt"
    path.write_text(text, encoding="utf-8")
    return VocabularyMap.read(path, IDS.get, special=[1, 2])


def test_the_map_reads_ngrams_the_always_line_and_skips_unknown_targets(tmp_path: Path) -> None:
    vmap = read_map(tmp_path, "▁a\t▁ein\n▁a ▁man\t▁Mann ▁nirgends\n▁rides\t▁fährt\n\t.\n")
    assert vmap.max_n == 2
    np.testing.assert_array_equal(vmap.always, [1, 2, 5])  # specials and the empty n-gram's
    np.testing.assert_array_equal(vmap.shortlist(["▁a", "▁man"]), [1, 2, 5, 20, 21])
    np.testing.assert_array_equal(vmap.shortlist(["▁man", "▁a"]), [1, 2, 5, 20])  # no "▁man ▁a" rule
    np.testing.assert_array_equal(vmap.shortlist([]), [1, 2, 5])


def test_a_rule_without_a_tab_is_refused_with_its_line(tmp_path: Path) -> None:
    with pytest.raises(ArtefactError, match=r"vmap.txt:2: no tab"):
        read_map(tmp_path, "▁a\t▁ein\n▁man ▁Mann\n")


def test_the_step_vocabulary_is_the_union_with_each_row_masked_to_its_sentence() -> None:
    step = StepVocabulary()
    step.add(0, np.array([1, 5, 9]))
    step.add(1, np.array([2, 5]))
    assert step.update(np.array([0, 0, 1]))
    np.testing.assert_array_equal(step.vocabulary, [1, 2, 5, 9])
    np.testing.assert_array_equal(step.mask, [[1, 0, 1, 1], [1, 0, 1, 1], [0, 1, 1, 0]])
    mask = step.mask
    assert not step.update(np.array([1, 0, 0]))  # rows moved, same sentences: in place
    assert step.mask is mask
    np.testing.assert_array_equal(step.mask, [[0, 1, 1, 0], [1, 0, 1, 1], [1, 0, 1, 1]])
    assert step.update(np.array([1, 1]))  # sentence 0 left: a smaller union, a new array
    np.testing.assert_array_equal(step.vocabulary, [2, 5])
    assert step.mask.all()


@pytest.fixture(scope="module")
def translator(shortlist_artefact: Path) -> OnnxTranslator:
    engine = OnnxTranslator(shortlist_artefact, SessionConfig("cpu", 1), shortlist=True)
    engine.warmup()
    return engine


def best(result: Translation | Exception) -> tuple[list[str], float]:
    assert isinstance(result, Translation), result
    return result.hypotheses[0].tokens, result.hypotheses[0].score


def test_every_output_token_is_in_its_sentences_shortlist(shortlist_artefact: Path, tmp_path: Path) -> None:
    """With a map sending each piece to the next one in the vocabulary, the reversal model's own
    output (its source's pieces) is out of reach: what it says instead stays in the shortlist."""
    plain = OnnxTranslator(shortlist_artefact, SessionConfig("cpu", 1))
    engine = OnnxTranslator(shortlist_artefact, SessionConfig("cpu", 1), shortlist=True)
    pieces = sorted(p for p in engine.tokenizer._full.get_vocab() if not p.startswith("<"))
    shifted = tmp_path / "shifted.vmap"
    shifted.write_text("".join(f"{a}\t{b}\n" for a, b in pairwise(pieces)), encoding="utf-8")
    vmap = engine.vocabulary_map = VocabularyMap.read(
        shifted, engine.tokenizer.token_to_id, [engine.bos_id, engine.eos_id]
    )
    for beam in (1, 4):
        items = [TranslateItem(t, TranslateOptions(beam_size=beam)) for t in TEXTS]
        outside = 0
        for item, got, free in zip(items, engine.translate(items), plain.translate(items), strict=True):
            allowed = set(vmap.shortlist(engine.tokenizer.encode([item.text])[0].tokens).tolist())
            assert {engine.tokenizer.token_to_id(t) for t in best(got)[0]} <= allowed, item.text
            outside += not {engine.tokenizer.token_to_id(t) for t in best(free)[0]} <= allowed
        assert outside  # without the shortlist the model says something else


def test_a_sentence_gets_the_same_answer_alone_in_a_batch_and_joining_a_running_decode(
    translator: OnnxTranslator,
) -> None:
    """Mixed beams in one batch, then rows for 5 only (sentences join as others finish): the
    tokens and the scores of each sentence are those it gets alone."""
    items = [TranslateItem(t, TranslateOptions(beam_size=1 + i % 2 * 3)) for i, t in enumerate(TEXTS * 2)]
    alone = [best(translator.translate([item])[0]) for item in items]
    assert [best(r) for r in translator.translate(items)] == alone
    translator.max_decode_rows = 5
    try:
        assert [best(r) for r in translator.translate(items)] == alone
    finally:
        translator.max_decode_rows = 512


def test_over_the_whole_vocabulary_it_translates_as_the_decoder_does(
    translator: OnnxTranslator, shortlist_artefact: Path
) -> None:
    plain = OnnxTranslator(shortlist_artefact, SessionConfig("cpu", 1))
    assert plain.vocabulary_map is None
    whole = OnnxTranslator(shortlist_artefact, SessionConfig("cpu", 1), shortlist=True)
    whole.vocabulary_map = VocabularyMap.whole(whole.manifest.vocab_size)
    items = [TranslateItem(t, TranslateOptions(beam_size=4)) for t in TEXTS]
    for got, want in zip(whole.translate(items), plain.translate(items), strict=True):
        (got_tokens, got_score), (want_tokens, want_score) = best(got), best(want)
        assert got_tokens == want_tokens
        assert got_score == pytest.approx(want_score, abs=1e-5)


def test_shortlists_need_an_artefact_exported_with_a_map(
    translation_artefact: Path, translation_fp16: Path
) -> None:
    with pytest.raises(ArtefactError, match="no vocabulary map"):
        OnnxTranslator(translation_artefact, SessionConfig("cpu", 1), shortlist=True)
    with pytest.raises(ArtefactError, match="fp16 variant has no shortlist"):
        OnnxTranslator(translation_fp16, SessionConfig("cpu", 1), shortlist=True)


@pytest.mark.parametrize("on", [True, False])
def test_the_setting_turns_shortlists_on_for_the_translators(shortlist_artefact: Path, on: bool) -> None:
    from service.serving.startup import load_engines
    from service.settings import Settings

    settings = Settings(
        artefact_root=shortlist_artefact.parent.parent,
        translate_models=["tiny-en-de"],
        embed_model="",
        cpu_variant="int8",
        provider="cpu",
        auto_export=False,
        translate_shortlist=on,
    )
    (engine,) = asyncio.run(load_engines(settings))
    assert isinstance(engine, OnnxTranslator)
    assert (engine.vocabulary_map is not None) == on
