"""The choice of a model: by name, by language pair (both policies), the default, and why none."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from service.serving.failures import ModelNotFound
from service.serving.routing import (
    UnservedLanguages,
    choose_embedding_model,
    choose_translation_model,
    translation_models,
)
from service.serving.runtime import Runtime
from tests.service.serving.conftest import started, translator
from tests.service.small_engines import HashEmbedder

pytestmark = pytest.mark.anyio


@pytest.fixture
async def three() -> AsyncIterator[Runtime]:
    """en→de (the default), de→en, and fr→de."""
    async with started(translator("en-de"), translator("de-en"), translator("fr-de")) as runtime:
        yield runtime


def named(runtime: Runtime, pair: str) -> str:
    return next(name for name in runtime.translation_models if name.endswith(pair))


@pytest.mark.parametrize(
    ("source", "target", "pair"),
    [
        ("en", "de", "en-de"),
        ("de", "en", "de-en"),
        ("fr", "de", "fr-de"),
        ("de", None, "de-en"),
        ("fr", None, "fr-de"),
        ("en", None, "en-de"),
        (None, "en", "de-en"),
        (None, None, "en-de"),  # neither: the default, the first configured
    ],
)
async def test_a_pair_goes_to_the_one_model_serving_it(
    three: Runtime, source: str | None, target: str | None, pair: str
) -> None:
    assert choose_translation_model(three, None, source, target).name == named(three, pair)


async def test_a_named_model_wins_over_the_languages(three: Runtime) -> None:
    """The languages are then checked against the named model's (by the translation path)."""
    name = named(three, "fr-de")
    assert choose_translation_model(three, name, "en", "en").name == name
    with pytest.raises(ModelNotFound, match="'opus-mt-en-fr' is not served here; translators: serving-"):
        choose_translation_model(three, "opus-mt-en-fr", None, None)


@pytest.mark.parametrize(
    ("source", "target", "reason", "field", "message"),
    [
        ("es", None, "source", "source_language", "'es' is not served as a source language"),
        ("es", "de", "source", "source_language", "'es' is not served as a source language"),
        (None, "es", "target", "target_language", "'es' is not served as a target language"),
        ("en", "es", "target", "target_language", "'es' is not served as a target language"),
        ("en", "en", "pair", "target_language", "'en' → 'en' is not served"),
        ("fr", "en", "pair", "target_language", "'fr' → 'en' is not served"),
    ],
)
async def test_a_pair_nobody_serves_names_the_field_and_lists_the_served_pairs(
    three: Runtime, source: str | None, target: str | None, reason: str, field: str, message: str
) -> None:
    with pytest.raises(UnservedLanguages) as refused:
        choose_translation_model(three, None, source, target)
    assert refused.value.reason == reason
    (found,) = refused.value.problems
    assert found["type"] == "unsupported_language_pair" and found["loc"] == ("body", field)
    assert found["msg"] == f"{message} (served pairs: en→de, de→en, fr→de)"
    assert found["ctx"] == {"limit": "en→de, de→en, fr→de"}


async def test_two_models_for_one_target_need_a_name_unless_the_first_may_serve(three: Runtime) -> None:
    with pytest.raises(UnservedLanguages) as refused:
        choose_translation_model(three, None, None, "de")
    assert refused.value.reason == "several"
    assert refused.value.candidates == [named(three, "en-de"), named(three, "fr-de")]
    (found,) = refused.value.problems
    assert found["type"] == "ambiguous_language_pair" and found["loc"] == ("body", "target_language")
    # A client that cannot name a model gets the first configured.
    assert choose_translation_model(three, None, None, "de", first_of_several=True).name == named(
        three, "en-de"
    )


async def test_no_translator_is_404_for_every_way_of_asking() -> None:
    async with started(HashEmbedder(name="serving-embed-only")) as runtime:
        for model, source, target in ((None, None, None), ("m", None, None), (None, "en", "de")):
            with pytest.raises(ModelNotFound, match="TSERVE_TRANSLATE_MODELS is empty"):
                choose_translation_model(runtime, model, source, target)
        with pytest.raises(ModelNotFound):
            translation_models(runtime)
        assert choose_embedding_model(runtime).engine.manifest.name == "serving-embed-only"
        assert (
            choose_embedding_model(runtime, "serving-embed-only").engine.manifest.name == "serving-embed-only"
        )
        with pytest.raises(ModelNotFound, match="this service embeds with 'serving-embed-only'"):
            choose_embedding_model(runtime, "text-embedding-3-small")


async def test_no_embedder_is_404(three: Runtime) -> None:
    assert [t.name for t in translation_models(three)] == list(three.translation_models)
    with pytest.raises(ModelNotFound, match="TSERVE_EMBED_MODEL is empty"):
        choose_embedding_model(three)
