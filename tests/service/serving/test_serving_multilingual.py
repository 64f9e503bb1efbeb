"""A multilingual model beside models of one pair: which serves a pair, the codes a request may
use for a language, the language tokens each sentence's options carry, and the refusal naming
the languages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.engine.base import TranslateItem, Translation
from service.serving.routing import UnservedLanguages, choose_translation_model
from service.serving.runtime import Runtime
from service.serving.translation import TranslationRequest, translate
from tests.service.serving.conftest import InProcessClient, started, translator
from tests.service.small_engines import ReverseTranslator

pytestmark = pytest.mark.anyio

# an NLLB-style model's languages and their tokens
TOKENS = {"eng_Latn": 101, "deu_Latn": 102, "fra_Latn": 103}


class RecordingMultilingual(ReverseTranslator):
    """A ReverseTranslator whose manifest names NLLB languages with their tokens, recording every
    item it translates."""

    def __init__(self, name: str, **hooks: Any) -> None:
        codes = tuple(TOKENS)
        super().__init__(name, source_languages=codes, target_languages=codes[1:] + codes[:1], **hooks)
        info = self.manifest.translation
        assert info is not None
        self.manifest = self.manifest.model_copy(
            update={"translation": info.model_copy(update={"language_tokens": TOKENS})}
        )
        self.items: list[TranslateItem] = []

    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]:
        self.items.extend(items)
        return super().translate(items)


@pytest.fixture
async def both() -> AsyncIterator[Runtime]:
    """en→de of its own (the default), then the multilingual model."""
    async with started(translator("en-de"), RecordingMultilingual("serving-nllb")) as runtime:
        yield runtime


def _model(runtime: Runtime, source: str | None, target: str | None) -> str:
    return choose_translation_model(runtime, None, source, target).name


async def test_the_multilingual_model_lists_its_languages_as_users_name_them(both: Runtime) -> None:
    nllb = both.translation_models["serving-nllb"]
    assert (nllb.sources, nllb.targets) == (["en", "de", "fr"], ["de", "fr", "en"])
    assert both.served_pairs() == ["en→de", "any two of de, en, fr"]


async def test_a_pair_of_its_own_goes_to_the_model_of_that_pair_and_the_others_to_the_multilingual(
    both: Runtime,
) -> None:
    assert _model(both, "en", "de").endswith("-en-de")  # both serve it: the bilingual one wins
    assert _model(both, "eng", "deu_Latn").endswith("-en-de")
    for source, target in (("en", "fr"), ("de", "en"), ("fra", "ger"), ("fr_Latn", None), (None, "fr")):
        assert _model(both, source, target) == "serving-nllb", (source, target)
    assert choose_translation_model(both, "serving-nllb", "en", "de").name == "serving-nllb"  # named


async def test_each_request_carries_its_languages_tokens(both: Runtime) -> None:
    engine = both.translation_models["serving-nllb"].engine
    assert isinstance(engine, RecordingMultilingual)
    asked = {("en", "fr"): ("en", "fr"), ("fra_Latn", "deu"): ("fr", "de"), ("de", "en"): ("de", "en")}
    for (source, target), listed in asked.items():
        request = TranslationRequest(["a b"], "text", model="serving-nllb", source=source, target=target)
        done = await translate(both, InProcessClient(), request)
        assert (done.source_language, done.target_language) == listed  # as listed, whatever was sent
    tokens = [(item.options.source_token, item.options.forced_first_token) for item in engine.items]
    assert tokens == [(101, 103), (103, 102), (102, 101)]


async def test_a_model_of_one_pair_gets_no_language_tokens(both: Runtime) -> None:
    request = TranslationRequest(["a b."], "text", source="en", target="de")
    done = await translate(both, InProcessClient(), request)
    assert done.model.endswith("-en-de")
    assert "serving-nllb" not in done.model


async def test_a_pair_no_model_serves_names_the_languages(both: Runtime) -> None:
    with pytest.raises(UnservedLanguages) as refused:
        choose_translation_model(both, None, "en", "es")
    (found,) = refused.value.problems
    assert found["type"] == "unsupported_language_pair" and found["loc"] == ("body", "target_language")
    assert (
        found["msg"] == "'es' is not served as a target language (served pairs: en→de, any two of de, en, fr)"
    )


async def test_a_detected_source_language_picks_its_token() -> None:
    async with started(RecordingMultilingual("serving-nllb-auto")) as runtime:
        engine = runtime.translation_models["serving-nllb-auto"].engine
        assert isinstance(engine, RecordingMultilingual)
        texts = ["The children are playing in the garden with their dog.", "Der Hund läuft über die Wiese."]
        request = TranslationRequest(texts, "text", source="auto", target="fr")
        found = await translate(runtime, InProcessClient(), request)
        assert [d.language for d in found.detected] == ["en", "de"]
        tokens = {
            (item.text, item.options.source_token, item.options.forced_first_token) for item in engine.items
        }
        assert tokens == {(texts[0], 101, 103), (texts[1], 102, 103)}
