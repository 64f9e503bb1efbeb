"""The translation path without HTTP: each step refuses before the next spends anything."""

from __future__ import annotations

import asyncio

import pytest

from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.serving.failures import InternalError, InvalidRequest
from service.serving.quotas import QuotaBook, QuotaExceeded
from service.serving.routing import UnservedLanguages
from service.serving.translation import TranslationRequest, translate
from service.settings import KeyQuota
from tests.service.serving.conftest import InProcessClient, started, translator

pytestmark = pytest.mark.anyio

FOUR_SENTENCES = "One dog runs. Two cats sit. Three birds fly. Four fish swim."
LIMITS = {"max_items_per_request": 3, "max_chars_per_text": 60, "max_translate_chars_per_request": 100}


def problems_of(refused: pytest.ExceptionInfo[InvalidRequest]) -> list[tuple[str, tuple[object, ...]]]:
    return [(p["type"], p["loc"]) for p in refused.value.problems]


async def test_texts_are_segmented_translated_and_put_back_in_order() -> None:
    engine = translator("en-de")
    async with started(engine) as runtime:
        client = InProcessClient()
        asked = TranslationRequest(["one two. Three four.", "five"], "q", n_best=2, beam_size=2)
        done = await translate(runtime, client, asked)
    assert client.stages == ["segment", "translate"]
    assert (done.model, done.source_language, done.target_language) == (engine.manifest.name, "en", "de")
    assert [t.hypotheses[0].text for t in done.texts] == ["TWO. one FOUR. Three", "FIVE"]
    assert [h.text for h in done.texts[1].hypotheses] == ["FIVE", "five"]
    assert engine.hooks.batches and sorted(t for b in engine.hooks.batches for t in b) == [
        "Three four.",
        "five",
        "one two.",
    ]
    assert (done.input_tokens, done.output_tokens) == (3 + 3 + 2, 3 + 3 + 2)


async def test_options_default_to_the_models_own() -> None:
    engine = translator("en-de")
    seen: list[TranslateOptions] = []
    original = engine.translate

    def spy(items: list[TranslateItem]) -> list[Translation | Exception]:
        seen.extend(item.options for item in items)
        return original(items)

    engine.translate = spy  # type: ignore[method-assign]
    async with started(engine) as runtime:
        await translate(runtime, InProcessClient(), TranslationRequest(["a b"], "text"))
        await translate(
            runtime, InProcessClient(), TranslationRequest(["a b"], "text", max_length=3, length_penalty=0.5)
        )
    assert [(o.max_length, o.length_penalty) for o in seen] == [(engine.max_len, 1.0), (3, 0.5)]


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (["a"] * 4, [("too_long", ("body", "text"))]),
        (
            ["a", "b" * 61, "c" * 61],
            [("string_too_long", ("body", "text", 1)), ("string_too_long", ("body", "text", 2))],
        ),
        (["a" * 60, "b" * 41], [("too_long", ("body", "text"))]),  # 101 characters together
    ],
)
async def test_text_limits_refuse_before_segmenting(
    texts: list[str], expected: list[tuple[str, tuple[object, ...]]]
) -> None:
    engine = translator("en-de")
    async with started(engine, **LIMITS) as runtime:
        client = InProcessClient()
        with pytest.raises(InvalidRequest) as refused:
            await translate(runtime, client, TranslationRequest(texts, "text"))
    assert problems_of(refused) == expected
    assert client.stages == [] and engine.hooks.batches == []


@pytest.mark.parametrize(
    ("settings", "asked", "expected"),
    [
        ({"max_sentences_per_request": 3}, {}, "too_many_sentences"),
        (
            {"max_queue": 3, "max_items_per_request": 3},
            {},
            "too_many_sentences",
        ),  # all must fit the queue at once
        ({"max_decode_cost_per_request": 4 * 4 * 16 - 1}, {"beam_size": 4}, "decode_cost_too_high"),
    ],
)
async def test_sentence_limits_refuse_after_segmenting_before_queueing(
    settings: dict[str, int], asked: dict[str, int], expected: str
) -> None:
    engine = translator("en-de")
    async with started(engine, **settings) as runtime:
        client = InProcessClient()
        with pytest.raises(InvalidRequest) as refused:
            await translate(runtime, client, TranslationRequest([FOUR_SENTENCES], "q", **asked))
    assert problems_of(refused) == [(expected, ("body", "q"))]
    assert client.stages == ["segment"] and engine.hooks.batches == []


async def test_html_that_cannot_be_kept_names_its_text() -> None:
    engine = translator("en-de")
    async with started(engine) as runtime:
        with pytest.raises(InvalidRequest) as refused:
            await translate(
                runtime, InProcessClient(), TranslationRequest(["<p>ok</p>", "<p>a</b>"], "q", "html")
            )
    assert problems_of(refused) == [("html_invalid", ("body", "q", 1))]
    assert engine.hooks.batches == []


async def test_what_the_model_cannot_do_is_refused_at_once_with_every_reason() -> None:
    engine = translator("de-en")
    async with started(engine) as runtime:
        asked = TranslationRequest(
            ["a"], "text", model=engine.manifest.name, source="en", target="de", max_length=17
        )
        with pytest.raises(InvalidRequest) as refused:
            await translate(runtime, InProcessClient(), asked)
    assert problems_of(refused) == [
        ("unsupported_language", ("body", "source_language")),
        ("unsupported_language", ("body", "target_language")),
        ("less_than_equal", ("body", "max_length")),
    ]
    assert engine.hooks.batches == []


async def test_libretranslates_policy_takes_the_first_model_and_detects_auto() -> None:
    en_de, fr_de, de_en = translator("en-de"), translator("fr-de"), translator("de-en")
    async with started(en_de, fr_de, de_en) as runtime:
        several = TranslationRequest(["a b"], "q", target="de", first_of_several=True)
        assert (await translate(runtime, InProcessClient(), several)).model == en_de.manifest.name
        with pytest.raises(UnservedLanguages):
            await translate(runtime, InProcessClient(), TranslationRequest(["a b"], "q", target="de"))
        auto = TranslationRequest(["Ein Hund"], "q", source="auto", target="en", first_of_several=True)
        done = await translate(runtime, InProcessClient(), auto)
    assert (done.model, done.source_language) == (de_en.manifest.name, "de")


async def test_a_mixed_language_auto_request_is_one_request_for_the_keys_quota() -> None:
    """Its texts go to two models, but the key's requests-per-minute counts it once."""
    en_de, fr_de = translator("en-de"), translator("fr-de")
    async with started(en_de, fr_de) as runtime:
        runtime.quotas = QuotaBook({"k": KeyQuota(requests_per_minute=1)}, clock=lambda: 0.0)
        texts = ["A dog runs in the park.", "Un chien court dans le parc."]
        mixed = TranslationRequest(texts, "q", source="auto", target="de", api_key="k")
        done = await translate(runtime, InProcessClient(), mixed)
        assert [d.language for d in done.detected] == ["en", "fr"]
        with pytest.raises(QuotaExceeded):
            await translate(runtime, InProcessClient(), mixed)


async def test_a_client_gone_leaves_no_work_behind() -> None:
    engine = translator("en-de")
    async with started(engine) as runtime:
        with pytest.raises(asyncio.CancelledError):
            await translate(runtime, InProcessClient(gone=True), TranslationRequest(["a b"], "q"))
        assert runtime.translation_models[engine.manifest.name].queue.queued == 0
    assert engine.hooks.batches == []


async def test_one_sentence_failing_fails_the_request_naming_its_text() -> None:
    async with started(translator("en-de")) as runtime:
        asked = TranslationRequest(["fine", "One dog runs. This will FAIL now. Two cats sit."], "q")
        with pytest.raises(InternalError, match=r"^q\[1\] failed: RuntimeError$"):
            await translate(runtime, InProcessClient(), asked)


async def test_inline_elements_go_around_the_words_aligned_to_theirs() -> None:
    """The reversing model aligns each word to its mirror: the plain sentence is translated
    whole, and each element (its attributes as written) is put back around its word."""
    engine = translator("en-de")
    seen: list[bool] = []
    original = engine.translate

    def spy(items: list[TranslateItem]) -> list[Translation | Exception]:
        seen.extend(item.options.alignments for item in items)
        return original(items)

    engine.translate = spy  # type: ignore[method-assign]
    texts = [
        "<p>Two <b>dogs</b> play.</p>",
        '<p>See <a href="/snow?a&amp;b">the snow</a></p>',
        "<p><i>All</i></p>",
    ]
    async with started(engine) as runtime:
        done = await translate(runtime, InProcessClient(), TranslationRequest(texts, "q", "html"))
    assert [t.hypotheses[0].text for t in done.texts] == [
        "<p>PLAY. <b>dogs</b> Two</p>",  # the first word upper-cased: the model's best hypothesis
        '<p><a href="/snow?a&amp;b">SNOW the</a> See</p>',
        "<p><i>ALL</i></p>",
    ]
    assert sorted(seen) == [False, True, True]  # an element over the whole sentence needs no alignment


async def test_hostile_inline_markup_is_translated_as_before_and_loses_nothing() -> None:
    engine = translator("en-de", max_len=4000)
    spans = "<p>" + "<span>dog</span> " * 600 + "</p>"  # more elements than a block takes
    unclosed = "<p>Two <b>dogs play</p>"
    async with started(
        engine, max_chars_per_text=len(spans), max_sentences_per_request=700, max_queue=700
    ) as runtime:
        done = await translate(
            runtime, InProcessClient(), TranslationRequest([spans, unclosed], "q", "html", max_length=8)
        )
    many, before = (t.hypotheses[0].text for t in done.texts)
    assert many.count("<span>DOG</span>") == 600
    assert before == "<p>TWO <b>PLAY dogs</p>"  # each run alone, as before
