"""Language identification, and source "auto": each text translated from its detected language."""

from __future__ import annotations

import pytest

from service.serving.detection import LanguageDetector, detect, served_languages
from service.serving.failures import InvalidRequest
from service.serving.routing import UnservedLanguages
from service.serving.translation import TranslationRequest, UntranslatableLanguage, translate
from tests.service.api.conftest import metric
from tests.service.serving.conftest import InProcessClient, started, translator

pytestmark = pytest.mark.anyio

ENGLISH = "Two dogs are playing in the snow."
GERMAN = "Zwei Hunde spielen im Schnee."
FRENCH = "Deux chiens jouent dans la neige."


def counted(language: str) -> float:
    return metric("tserve_language_detections_total", language=language)


def test_the_served_languages_are_the_candidates() -> None:
    detector = LanguageDetector(["en", "de"])
    english, german = detector.detect(ENGLISH), detector.detect(GERMAN)
    assert (english.language, english.served) == ("en", True)
    assert [code for code, _ in english.ranking] == ["en", "de"]
    assert english.confidence > 99 and english.confidence == english.ranking[0][1]
    assert german.language == "de" and german.confidence > 99
    # Three words: among every language the identifier knows this is not English; among the
    # served ones it is.
    assert detector.detect("A black dog").language == "en"
    assert detector.detect("Ein schwarzer Hund").language == "de"


def test_a_language_not_served_is_named_not_taken_for_a_served_one() -> None:
    french = LanguageDetector(["en", "de"]).detect(FRENCH)
    assert (french.language, french.served) == ("fr", False)
    assert french.ranking[0] == ("fr", french.confidence) and french.confidence > 50
    assert sorted(code for code, _ in french.ranking[1:]) == ["de", "en"]
    assert all(confidence < 1 for _, confidence in french.ranking[1:])


def test_a_text_without_letters_is_undetermined() -> None:
    for text in ("123 456", "!!! ???", "🙂"):
        found = LanguageDetector(["de", "en"]).detect(text)
        assert found.undetermined and (found.language, found.ranking) == ("de", (("de", 0.0),))


def test_html_is_detected_on_what_a_reader_sees() -> None:
    page = '<div class="header"><span title="Ein Hund">Ein Hund läuft.</span></div>'
    assert LanguageDetector(["en", "de"]).detect(page, "html").language == "de"


def test_a_served_code_with_a_region_is_found_by_its_language() -> None:
    detector = LanguageDetector(["en", "de-CH", "xx"])  # xx: unknown to the identifier, never found
    assert detector.detect(GERMAN).language == "de-CH"
    assert [code for code, _ in detector.detect(ENGLISH).ranking] == ["en", "de-CH"]


async def test_detection_is_counted_by_served_language_or_other() -> None:
    async with started(translator("en-de"), translator("de-en")) as runtime:
        assert served_languages(runtime) == ["en", "de"]
        before = {label: counted(label) for label in ("en", "de", "other")}
        found = await detect(runtime, [ENGLISH, GERMAN, GERMAN, FRENCH, "42"])
    assert [d.language for d in found] == ["en", "de", "de", "fr", "en"]
    assert {label: counted(label) - before[label] for label in before} == {"en": 1, "de": 2, "other": 2}


async def test_the_same_text_gets_the_same_answer_alone_or_among_others() -> None:
    async with started(translator("en-de"), translator("de-en")) as runtime:
        alone = await detect(runtime, ["Ein Mann"])
        among = await detect(runtime, [ENGLISH, "Ein Mann", FRENCH])
    assert alone[0] == among[1]


async def test_each_text_goes_to_the_model_of_its_language() -> None:
    en_de, fr_de = translator("en-de"), translator("fr-de")
    async with started(en_de, fr_de) as runtime:
        asked = TranslationRequest([FRENCH, ENGLISH, "Le chat dort."], "text", target="de", source="auto")
        done = await translate(runtime, InProcessClient(), asked)
    assert [d.language for d in done.detected] == ["fr", "en", "fr"]
    assert [t.hypotheses[0].text for t in done.texts] == [
        "NEIGE. la dans jouent chiens Deux",
        "SNOW. the in playing are dogs Two",
        "DORT. chat Le",
    ]
    assert (done.model, done.source_language) == (fr_de.manifest.name, "fr")
    assert sorted(t for b in fr_de.hooks.batches for t in b) == [FRENCH, "Le chat dort."]
    assert [t for b in en_de.hooks.batches for t in b] == [ENGLISH]


async def test_a_language_no_model_translates_into_the_target_is_refused_by_name() -> None:
    en_de, de_en = translator("en-de"), translator("de-en")
    async with started(en_de, de_en) as runtime:
        asked = TranslationRequest([ENGLISH, GERMAN, FRENCH], "q", target="de", source="auto")
        with pytest.raises(UntranslatableLanguage) as refused:
            await translate(runtime, InProcessClient(), asked)
    first, second = refused.value.problems
    assert (first["type"], first["loc"]) == ("unsupported_detected_language", ("body", "q", 1))
    assert "detected as German (de, confidence" in first["msg"]
    assert "no model translates into de (served pairs: en→de, de→en)" in first["msg"]
    assert second["loc"] == ("body", "q", 2) and "French (fr" in second["msg"]
    assert en_de.hooks.batches == [] and de_en.hooks.batches == []


async def test_a_named_model_must_read_the_detected_language() -> None:
    en_de = translator("en-de")
    async with started(en_de, translator("de-en")) as runtime:
        asked = TranslationRequest([GERMAN], "text", model=en_de.manifest.name, source="auto")
        with pytest.raises(UntranslatableLanguage, match="German"):
            await translate(runtime, InProcessClient(), asked)


async def test_an_undetermined_text_goes_to_a_model_writing_the_target() -> None:
    de_en = translator("de-en")
    async with started(translator("en-de"), de_en) as runtime:
        asked = TranslationRequest(["12 34"], "q", target="en", source="auto")
        done = await translate(runtime, InProcessClient(), asked)
    assert (done.model, done.detected[0].confidence) == (de_en.manifest.name, 0.0)


async def test_a_target_nothing_writes_is_the_routing_refusal() -> None:
    async with started(translator("en-de")) as runtime:
        asked = TranslationRequest([ENGLISH], "q", target="fr", source="auto")
        with pytest.raises(UnservedLanguages) as refused:
            await translate(runtime, InProcessClient(), asked)
    assert refused.value.reason == "target"


async def test_text_limits_refuse_before_detecting() -> None:
    async with started(translator("en-de"), max_chars_per_text=20) as runtime:
        before = counted("en")
        asked = TranslationRequest(["short", ENGLISH], "text", target="de", source="auto")
        with pytest.raises(InvalidRequest) as refused:
            await translate(runtime, InProcessClient(), asked)
    assert [p["loc"] for p in refused.value.problems] == [("body", "text", 1)]
    assert counted("en") == before


async def test_a_later_steps_refusal_names_the_text_by_its_place_in_the_request() -> None:
    async with started(translator("en-de"), translator("fr-de")) as runtime:
        broken = "<p>Le chat dort.</b>"
        asked = TranslationRequest([ENGLISH, broken], "q", target="de", source="auto", format="html")
        with pytest.raises(InvalidRequest) as refused:
            await translate(runtime, InProcessClient(), asked)
    assert [(p["type"], p["loc"]) for p in refused.value.problems] == [("html_invalid", ("body", "q", 1))]
