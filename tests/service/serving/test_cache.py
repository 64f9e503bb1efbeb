"""The translation cache: its byte bound, what it keeps, and that every decoding parameter, the
model and the shortlist setting are in its key (a sentence reaches the engine again whenever one
of them differs)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest

from service.engine.base import TranslateItem, TranslateOptions, Translation, TranslationHypothesis
from service.serving.cache import CacheKey, TranslationCache, artefact_identity, translation_bytes
from service.serving.failures import InternalError
from service.serving.translation import TranslationRequest, translate
from tests.service.api.conftest import metric
from tests.service.serving.conftest import InProcessClient, started, translator
from tests.service.small_engines import ReverseTranslator


def translation(text: str, n_best: int = 1) -> Translation:
    hypotheses = [TranslationHypothesis(f"{text} {k}", -0.1 * k, text.split(), None) for k in range(n_best)]
    return Translation(hypotheses, text.split(), len(text.split()) + 1, len(text.split()) + 1)


def keys_of(
    cache: TranslationCache, engine: ReverseTranslator, *texts: str, **options: Any
) -> list[CacheKey]:
    items = [TranslateItem(t, TranslateOptions(**options)) for t in texts]
    return cache.keys(engine.manifest, False, items)


def test_the_least_recently_used_entries_go_first_once_over_the_byte_bound() -> None:
    engine = ReverseTranslator(name="cache-bound")
    probe = TranslationCache(1 << 20)
    (one,) = keys_of(probe, engine, "sentence 0")
    probe.store(one, translation("sentence 0"))
    entry = probe.bytes  # every entry below has the same size
    assert entry > translation_bytes(translation("sentence 0")) > 0

    cache = TranslationCache(3 * entry)
    keys = keys_of(cache, engine, *(f"sentence {i}" for i in range(5)))
    for key in keys[:3]:
        cache.store(key, translation(key[2]))
    assert len(cache) == 3 and cache.bytes == 3 * entry
    assert cache.lookup(engine.manifest.name, [keys[0]])[0] is not None  # now the most recently used
    evicted_before = metric("tserve_translation_cache_evictions_total")
    cache.store(keys[3], translation(keys[3][2]))
    cache.store(keys[4], translation(keys[4][2]))
    assert cache.bytes == 3 * entry <= cache.max_bytes
    assert metric("tserve_translation_cache_evictions_total") - evicted_before == 2
    found = cache.lookup(engine.manifest.name, keys)
    assert [f is not None for f in found] == [True, False, False, True, True]
    assert metric("tserve_translation_cache_bytes") == cache.bytes


def test_an_entry_larger_than_the_whole_cache_is_not_kept_and_evicts_nothing() -> None:
    engine = ReverseTranslator(name="cache-large")
    cache = TranslationCache(2000)
    small, large = keys_of(cache, engine, "a b", "x " * 400)
    cache.store(small, translation("a b"))
    cache.store(large, translation("x " * 400))
    assert [f is not None for f in cache.lookup(engine.manifest.name, [small, large])] == [True, False]


def test_only_whole_successful_translations_are_kept() -> None:
    engine = ReverseTranslator(name="cache-whole")
    cache = TranslationCache(1 << 20)
    failed, partial, whole = keys_of(cache, engine, "a", "b", "c", beam_size=4, n_best=2)
    cache.store(failed, RuntimeError("this item failed"))
    cache.store(partial, translation("b", n_best=1))  # fewer hypotheses than its n_best
    cache.store(whole, translation("c", n_best=2))
    assert [f is not None for f in cache.lookup(engine.manifest.name, [failed, partial, whole])] == [
        False,
        False,
        True,
    ]


def test_a_cache_of_zero_bytes_keeps_nothing_and_counts_nothing() -> None:
    engine = ReverseTranslator(name="cache-off")
    cache = TranslationCache(0)
    (key,) = keys_of(cache, engine, "a b")
    cache.store(key, translation("a b"))
    assert cache.lookup(engine.manifest.name, [key]) == [None] and len(cache) == 0
    assert metric("tserve_translation_cache_misses_total", model=engine.manifest.name) == 0


def test_the_key_names_the_artefact_the_shortlist_the_sentence_and_every_option() -> None:
    engine, other = ReverseTranslator(name="cache-key"), ReverseTranslator(name="cache-key-other")
    cache = TranslationCache(1 << 20)
    item = TranslateItem("a b", TranslateOptions())
    (key,) = cache.keys(engine.manifest, False, [item])
    assert key == (artefact_identity(engine.manifest), False, "a b", TranslateOptions())
    assert cache.keys(engine.manifest, True, [item]) != [key]
    assert cache.keys(other.manifest, False, [item]) != [key]
    changed = engine.manifest.model_copy(update={"created_at": "2026-02-02T00:00:00+00:00"})
    assert artefact_identity(changed) != artefact_identity(engine.manifest)  # same name, re-exported


DEFAULTS: dict[str, Any] = {"beam_size": 4, "n_best": 1}
VARIANTS: list[dict[str, Any]] = [
    {"beam_size": 2},
    {"n_best": 2},
    {"max_length": 3},
    {"length_penalty": 0.5},
    {"alignments": True},
]


@pytest.mark.anyio
async def test_requests_differing_in_any_decoding_parameter_never_share_an_entry() -> None:
    engine = translator("en-de")
    text = "one two three four"
    async with started(engine) as runtime:

        async def ask(**options: Any) -> Any:
            request = TranslationRequest([text], "text", **{**DEFAULTS, **options})
            return (await translate(runtime, InProcessClient(), request)).texts[0]

        first = await ask()
        engine.hooks.batches.clear()
        assert await ask() == first and engine.hooks.batches == []  # the same parameters: cached
        answers = []
        for variant in VARIANTS:
            answers.append(await ask(**variant))
            assert engine.hooks.batches == [[text]], variant  # computed, not taken from another entry
            engine.hooks.batches.clear()
        for variant, answer in zip(VARIANTS, answers, strict=True):
            assert await ask(**variant) == answer, variant  # each now cached under its own key
        assert engine.hooks.batches == []
    assert [a.hypotheses[0].text for a in answers[2:4]] == ["FOUR three two", first.hypotheses[0].text]


@pytest.mark.anyio
async def test_two_models_never_share_an_entry_for_the_same_sentence() -> None:
    en_de, en_fr = translator("en-de"), translator("en-fr")
    async with started(en_de, en_fr) as runtime:
        for _engine, target in ((en_de, "de"), (en_fr, "fr"), (en_de, "de"), (en_fr, "fr")):
            request = TranslationRequest(["a b"], "text", target=target)
            await translate(runtime, InProcessClient(), request)
    assert en_de.hooks.batches == [["a b"]] and en_fr.hooks.batches == [["a b"]]


@pytest.mark.anyio
async def test_a_failed_sentence_is_computed_again_and_its_neighbours_are_kept() -> None:
    engine = translator("en-de")
    async with started(engine) as runtime:
        for _ in range(2):
            with pytest.raises(InternalError):
                await translate(
                    runtime, InProcessClient(), TranslationRequest(["One dog. Two FAIL cats."], "text")
                )
        await translate(runtime, InProcessClient(), TranslationRequest(["One dog."], "text"))
    computed = sorted(t for batch in engine.hooks.batches for t in batch)
    assert computed == ["One dog.", "Two FAIL cats.", "Two FAIL cats."]


@pytest.mark.anyio
async def test_with_the_cache_off_every_sentence_reaches_the_engine() -> None:
    engine = translator("en-de")
    async with started(engine, translation_cache_bytes=0) as runtime:
        for _ in range(2):
            await translate(runtime, InProcessClient(), TranslationRequest(["One dog."], "text"))
    assert engine.hooks.batches == [["One dog."], ["One dog."]]


def test_every_option_is_part_of_the_key() -> None:
    """The key holds the whole ``TranslateOptions``: every field of it takes part in its equality
    and hash, so a field added there is in the key at once."""
    base = TranslateOptions()
    changed = {
        "beam_size": 5,
        "n_best": 2,
        "max_length": 7,
        "length_penalty": 0.3,
        "alignments": True,
        "forced_first_token": 9,
        "source_token": 8,
        "required": ("Warenkorb",),
        "required_sources": ((4, 8),),
    }
    assert {f.name for f in fields(TranslateOptions) if f.compare and f.hash is not False} == set(changed)
    for name, value in changed.items():
        assert replace(base, **{name: value}) != base
        assert hash(replace(base, **{name: value})) != hash(base)
