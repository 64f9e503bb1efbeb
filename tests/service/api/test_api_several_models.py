"""Several translation models in one app: routing by language pair or ``model``, the 422/400 for
a pair nobody serves, a queue, metrics and readiness per model, every pair listed."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.engine.base import Engine
from service.http.app import create_app
from tests.service.api.conftest import Served, error_of, eventually, metric, serving, small_settings
from tests.service.small_engines import HashEmbedder, ReverseTranslator

pytestmark = pytest.mark.anyio

_runs = itertools.count()


def translator(pair: str, **hooks: Any) -> ReverseTranslator:
    """A ReverseTranslator for ``pair`` ("en-de") with a name unique to this run (metrics are global)."""
    source, target = pair.split("-")
    return ReverseTranslator(
        name=f"multi-{next(_runs)}-{pair}", source_languages=(source,), target_languages=(target,), **hooks
    )


@dataclass
class Two:
    served: Served
    en_de: ReverseTranslator
    de_en: ReverseTranslator


@pytest.fixture
async def two() -> AsyncIterator[Two]:
    en_de, de_en = translator("en-de"), translator("de-en")
    async with serving(given=[en_de, de_en, HashEmbedder(name=f"multi-{next(_runs)}-embed")]) as s:
        yield Two(s, en_de, de_en)


def texts_seen(engine: ReverseTranslator) -> list[str]:
    return [text for batch in engine.hooks.batches for text in batch]


@pytest.mark.parametrize(
    ("languages", "expected"),
    [
        ({"source_language": "de"}, ("de_en", "de", "en")),
        ({"target_language": "en"}, ("de_en", "de", "en")),
        ({"source_language": "de", "target_language": "en"}, ("de_en", "de", "en")),
        ({"source_language": "en"}, ("en_de", "en", "de")),
        ({"target_language": "de"}, ("en_de", "en", "de")),
        ({}, ("en_de", "en", "de")),  # neither: the default, the first configured
    ],
)
async def test_routed_by_language_pair(
    two: Two, languages: dict[str, str], expected: tuple[str, ...]
) -> None:
    engine_attr, source, target = expected
    chosen: ReverseTranslator = getattr(two, engine_attr)
    other = two.de_en if chosen is two.en_de else two.en_de
    r = await two.served.client.post("/v1/translate", json={"text": "ein Hund läuft", **languages})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["model"], body["source_language"], body["target_language"]) == (
        chosen.manifest.name,
        source,
        target,
    )
    assert body["translations"][0]["hypotheses"][0]["text"] == "LÄUFT Hund ein"
    assert texts_seen(chosen) == ["ein Hund läuft"] and texts_seen(other) == []


async def test_routed_by_model_name(two: Two) -> None:
    name = two.de_en.manifest.name
    r = await two.served.client.post("/v1/translate", json={"text": "a b", "model": name})
    assert r.status_code == 200 and r.json()["model"] == name
    assert texts_seen(two.de_en) == ["a b"] and texts_seen(two.en_de) == []


async def test_a_named_model_checks_its_own_languages(two: Two) -> None:
    body = {"text": "a b", "model": two.de_en.manifest.name, "target_language": "de"}
    r = await two.served.client.post("/v1/translate", json=body)
    assert r.status_code == 422
    (detail,) = error_of(r)["details"]
    assert (detail["field"], detail["type"]) == ("target_language", "unsupported_language")
    assert two.de_en.hooks.batches == [] and two.en_de.hooks.batches == []


async def test_an_unknown_model_is_404_naming_the_served_ones(two: Two) -> None:
    r = await two.served.client.post("/v1/translate", json={"text": "a b", "model": "opus-mt-en-fr"})
    assert r.status_code == 404
    error = error_of(r)
    assert error["type"] == "model_not_found"
    assert two.en_de.manifest.name in error["message"] and two.de_en.manifest.name in error["message"]


@pytest.mark.parametrize(
    ("languages", "field", "asked"),
    [
        ({"source_language": "fr"}, "source_language", "'fr' is not served as a source language"),
        ({"target_language": "fr"}, "target_language", "'fr' is not served as a target language"),
        ({"source_language": "en", "target_language": "fr"}, "target_language", "'fr' is not served"),
        ({"source_language": "en", "target_language": "en"}, "target_language", "'en' → 'en' is not served"),
    ],
)
async def test_an_unserved_pair_is_422_listing_the_served_pairs(
    two: Two, languages: dict[str, str], field: str, asked: str
) -> None:
    r = await two.served.client.post("/v1/translate", json={"text": "a b", **languages})
    assert r.status_code == 422, r.text
    (detail,) = error_of(r)["details"]
    assert (detail["field"], detail["type"]) == (field, "unsupported_language_pair")
    assert detail["limit"] == "en→de, de→en"
    assert asked in detail["message"] and "served pairs: en→de, de→en" in detail["message"]
    assert two.de_en.hooks.batches == [] and two.en_de.hooks.batches == []


async def test_two_models_for_one_pair_need_a_model_name() -> None:
    first, second = translator("en-de"), translator("en-de")
    async with serving(given=[first, second]) as s:
        r = await s.client.post("/v1/translate", json={"text": "a b", "target_language": "de"})
        assert r.status_code == 422
        (detail,) = error_of(r)["details"]
        assert detail["type"] == "ambiguous_language_pair"
        assert first.manifest.name in detail["message"] and second.manifest.name in detail["message"]
        r = await s.client.post(
            "/v1/translate", json={"text": "a b", "target_language": "de", "model": second.manifest.name}
        )
        assert r.json()["model"] == second.manifest.name
        r = await s.client.post("/v1/translate", json={"text": "a b"})
        assert r.json()["model"] == first.manifest.name


async def test_each_model_has_its_own_queue() -> None:
    """A model busy with a held batch does not delay another model's requests."""
    gate = threading.Event()
    held, free = translator("en-de", gate=gate), translator("de-en")
    async with serving(given=[held, free]) as s:
        try:
            waiting = asyncio.ensure_future(
                s.client.post("/v1/translate", json={"text": "x y", "source_language": "en"})
            )
            await eventually(lambda: held.hooks.batches != [])
            r = await s.client.post("/v1/translate", json={"text": "a b", "source_language": "de"})
            assert r.status_code == 200 and r.json()["model"] == free.manifest.name
            assert not waiting.done()
        finally:
            gate.set()
        assert (await waiting).status_code == 200


async def test_per_model_metrics_move_only_for_the_model_used(two: Two) -> None:
    a, b = two.de_en.manifest.name, two.en_de.manifest.name
    names = ("tserve_batch_size_sum", "tserve_batch_tokens_sum", "tserve_stage_duration_seconds_count")
    before = {(n, m): metric(n, model=m, **_stage(n)) for n in names for m in (a, b)}
    for text in ("ein Hund", "zwei Katzen spielen"):
        r = await two.served.client.post("/v1/translate", json={"text": text, "source_language": "de"})
        assert r.status_code == 200
    moved = {n: metric(n, model=a, **_stage(n)) - before[(n, a)] for n in names}
    assert moved == {
        "tserve_batch_size_sum": 2,  # one sentence per request
        "tserve_batch_tokens_sum": 3 + 4,  # words + </s>
        "tserve_stage_duration_seconds_count": 2,
    }
    for n in names:
        assert metric(n, model=b, **_stage(n)) == before[(n, b)], n
    for m in (a, b):
        info = {"task": "translate", "variant": "fp32", "provider": "CPUExecutionProvider"}
        assert metric("tserve_model_info", model=m, **info) == 1


def _stage(name: str) -> dict[str, str]:
    return {"stage": "queue"} if name.startswith("tserve_stage") else {}


async def test_ready_only_once_every_model_is_warm() -> None:
    quick, slow = translator("en-de"), translator("de-en")
    warm_slow = threading.Event()  # the slow model's warm-up ends when the test says so

    def slow_warm_up() -> None:
        assert warm_slow.wait(10), "the test never let the slow model warm up"
        slow.hooks.warmed = True

    slow.hooks.warm = slow_warm_up  # type: ignore[method-assign]
    embedder = HashEmbedder(name=f"multi-{next(_runs)}-embed")
    async with serving(given=[quick, slow, embedder], wait_ready=False) as s:
        await eventually(lambda: quick.hooks.warmed)
        r = await s.client.get("/health/ready")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert not slow.hooks.warmed
        warm_slow.set()
        await eventually(lambda: slow.hooks.warmed)
        await eventually(lambda: s.app.state.runtime.state == "ready")
        r = await s.client.get("/health/ready")
        assert r.status_code == 200
        assert r.json()["models"] == [quick.manifest.name, slow.manifest.name, embedder.manifest.name]


async def test_models_lists_every_model_with_its_languages(two: Two) -> None:
    cards = {c["id"]: c for c in (await two.served.client.get("/v1/models")).json()["data"]}
    assert len(cards) == 3
    en_de, de_en = cards[two.en_de.manifest.name], cards[two.de_en.manifest.name]
    assert (en_de["source_languages"], en_de["target_languages"]) == (["en"], ["de"])
    assert (de_en["source_languages"], de_en["target_languages"]) == (["de"], ["en"])


async def test_duplicate_engine_names_are_refused() -> None:
    first = translator("en-de")
    twin = ReverseTranslator(name=first.manifest.name, source_languages=("de",), target_languages=("en",))
    given: list[Engine] = [first, twin]
    app = create_app(small_settings(), given)
    async with app.router.lifespan_context(app):
        await eventually(lambda: app.state.runtime.state == "failed")
    assert f"more than one engine named {first.manifest.name}" in app.state.runtime.detail


# ---- LibreTranslate --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target", "q", "engine_attr", "detected"),
    [
        ("de", "en", "a b", "de_en", None),
        ("en", "de", "a b", "en_de", None),
        ("auto", "en", "Ein Hund", "de_en", "de"),  # detected: German
        ("auto", "de", "A dog", "en_de", "en"),
    ],
)
async def test_libretranslate_routes_by_pair(
    two: Two, source: str, target: str, q: str, engine_attr: str, detected: str | None
) -> None:
    r = await two.served.client.post("/translate", json={"q": q, "source": source, "target": target})
    assert r.status_code == 200, r.text
    answer = r.json()
    first, second = q.split()
    assert answer.pop("translatedText") == f"{second.upper()} {first}"
    if detected:
        found = answer.pop("detectedLanguage")
        assert found["language"] == detected and 50 < found["confidence"] <= 100
    assert answer == {}
    assert texts_seen(getattr(two, engine_attr)) == [q]


@pytest.mark.parametrize(
    ("source", "target", "needle"),
    [
        ("fr", "de", "fr is not supported"),
        ("en", "en", "en→en is not supported"),
        ("de", "fr", "de→fr is not supported"),
        ("auto", "fr", "fr is not supported"),
    ],
)
async def test_libretranslate_unserved_pair_is_400_listing_the_pairs(
    two: Two, source: str, target: str, needle: str
) -> None:
    r = await two.served.client.post("/translate", json={"q": "a b", "source": source, "target": target})
    assert r.status_code == 400
    message = r.json()["error"]
    assert set(r.json()) == {"error"}
    assert needle in message and "served pairs: en→de, de→en" in message
    assert two.de_en.hooks.batches == [] and two.en_de.hooks.batches == []


async def test_libretranslate_auto_takes_the_model_of_each_texts_language() -> None:
    en_de, fr_de = translator("en-de"), translator("fr-de")
    async with serving(given=[en_de, fr_de]) as s:
        q = ["Le chat dort sur le lit.", "The cat sleeps on the bed."]
        r = await s.client.post("/translate", json={"q": q, "source": "auto", "target": "de"})
        assert r.status_code == 200, r.text
        assert [d["language"] for d in r.json()["detectedLanguage"]] == ["fr", "en"]
        assert (texts_seen(fr_de), texts_seen(en_de)) == ([q[0]], [q[1]])


async def test_languages_lists_every_source_with_all_its_targets() -> None:
    given: list[Engine] = [translator("en-de"), translator("de-en"), translator("en-fr")]
    async with serving(given=given) as s:
        languages = (await s.client.get("/languages")).json()
        by_code = {entry["code"]: entry for entry in languages}
        assert [entry["code"] for entry in languages] == ["en", "de", "fr"]
        assert by_code["en"]["targets"] == ["de", "fr"]
        assert by_code["de"]["targets"] == ["en"]
        assert by_code["fr"]["targets"] == []  # written, never read
        assert by_code["de"]["name"] == "German"
        settings = (await s.client.get("/frontend/settings")).json()
        assert settings["language"]["source"]["code"] == "en"  # the default model's pair
        assert settings["language"]["target"]["code"] == "de"


async def test_a_missing_model_the_auto_export_cannot_make_fails_clearly(tmp_path: Path) -> None:
    """Only the default models come from `python -m export default`: no export is started for
    another name, and the failure says how to export it."""
    settings = small_settings(
        artefact_root=str(tmp_path), auto_export=True, translate_models=["transformer-en-de", "opus-mt-de-en"]
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        await eventually(lambda: app.state.runtime.state == "failed")
    detail = app.state.runtime.detail
    assert f"artefacts for opus-mt-de-en under {tmp_path}" in detail  # only the one it cannot make
    assert "python -m export SOURCE --name NAME" in detail
    assert not (tmp_path / "transformer-en-de").exists()  # nothing was exported


async def test_a_requested_model_name_never_becomes_a_metric_label(two: Two) -> None:
    from prometheus_client import REGISTRY

    r = await two.served.client.post("/v1/translate", json={"text": "a", "model": "label-from-a-client"})
    assert r.status_code == 404
    values = {v for family in REGISTRY.collect() for sample in family.samples for v in sample.labels.values()}
    assert "label-from-a-client" not in values
    assert two.de_en.manifest.name in values  # the loaded ones are there
