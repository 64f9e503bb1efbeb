"""LibreTranslate's POST /detect, and source_language "auto" on /v1/translate."""

from __future__ import annotations

import itertools

import pytest

from tests.service.api.conftest import Served, error_of, metric, serving, small_settings
from tests.service.small_engines import ReverseTranslator

pytestmark = pytest.mark.anyio

_runs = itertools.count()
ENGLISH = "Two dogs are playing in the snow."
GERMAN = "Zwei Hunde spielen im Schnee."
FRENCH = "Deux chiens jouent dans la neige."


def translator(pair: str) -> ReverseTranslator:
    source, target = pair.split("-")
    return ReverseTranslator(
        name=f"detect-{next(_runs)}-{pair}", source_languages=(source,), target_languages=(target,)
    )


async def test_detect_answers_the_candidates_best_first(served: Served) -> None:
    r = await served.client.post("/detect", json={"q": GERMAN})
    assert r.status_code == 200, r.text
    found = r.json()
    assert [c["language"] for c in found] == ["de", "en"]  # what the served model reads and writes
    assert all(set(c) == {"confidence", "language"} for c in found)
    assert found[0]["confidence"] > 99 and found[0]["confidence"] + found[1]["confidence"] == pytest.approx(
        100
    )


async def test_detect_takes_a_form_as_libretranslatepy_sends_it(served: Served) -> None:
    r = await served.client.post("/detect", data={"q": ENGLISH})
    assert r.status_code == 200, r.text
    assert r.json()[0]["language"] == "en"


async def test_detect_merges_a_list_weighting_each_text_by_its_length(served: Served) -> None:
    r = await served.client.post("/detect", json={"q": [ENGLISH, "Ein Hund", ENGLISH]})
    assert r.status_code == 200, r.text
    (en, de) = r.json()
    assert en["language"] == "en" and 80 < en["confidence"] < 100
    assert de["language"] == "de" and en["confidence"] + de["confidence"] == pytest.approx(100, abs=0.02)


async def test_detect_names_a_language_no_model_serves(served: Served) -> None:
    r = await served.client.post("/detect", json={"q": FRENCH})
    first, *served_ones = r.json()
    assert first["language"] == "fr" and first["confidence"] > 50
    assert sorted(c["language"] for c in served_ones) == ["de", "en"]
    assert all(c["confidence"] < 1 for c in served_ones)


async def test_detect_counts_each_text_by_language_or_other(served: Served) -> None:
    before = {label: metric("tserve_language_detections_total", language=label) for label in ("en", "other")}
    await served.client.post("/detect", json={"q": [ENGLISH, FRENCH, "42"]})
    after = {label: metric("tserve_language_detections_total", language=label) for label in ("en", "other")}
    assert (after["en"] - before["en"], after["other"] - before["other"]) == (1, 2)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({}, "q"),
        ({"q": ""}, "q"),
        ({"q": 42}, "q"),
        ({"q": ["x"] * 9}, "at most 8 texts"),
        ({"q": "y" * 201}, "200"),
    ],
)
async def test_bad_detect_requests_are_400_in_libretranslates_shape(
    served: Served, body: dict[str, object], needle: str
) -> None:
    before = metric("tserve_language_detections_total", language="en")
    r = await served.client.post("/detect", json=body)
    assert r.status_code == 400 and set(r.json()) == {"error"}
    assert needle in r.json()["error"]
    assert metric("tserve_language_detections_total", language="en") == before  # nothing detected


async def test_detect_is_a_post(served: Served) -> None:
    assert (await served.client.get("/detect")).status_code == 405


async def test_detect_checks_the_key_as_libretranslate_does() -> None:
    async with serving(small_settings(api_keys=["k1"])) as s:
        r = await s.client.post("/detect", json={"q": ENGLISH})
        assert r.status_code == 403 and set(r.json()) == {"error"}
        r = await s.client.post("/detect", json={"q": ENGLISH, "api_key": "k1"})
        assert r.status_code == 200


async def test_v1_translate_auto_reports_each_texts_language() -> None:
    en_de, fr_de = translator("en-de"), translator("fr-de")
    async with serving(given=[en_de, fr_de]) as s:
        body = {"text": [FRENCH, ENGLISH], "source_language": "auto", "target_language": "de"}
        r = await s.client.post("/v1/translate", json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
    assert (answer["model"], answer["source_language"]) == (fr_de.manifest.name, "fr")
    detected = [t["detected_language"] for t in answer["translations"]]
    assert [d["language"] for d in detected] == ["fr", "en"] and all(d["confidence"] > 90 for d in detected)
    assert [t["hypotheses"][0]["text"] for t in answer["translations"]] == [
        "NEIGE. la dans jouent chiens Deux",
        "SNOW. the in playing are dogs Two",
    ]


async def test_v1_translate_without_auto_reports_no_detection(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": ENGLISH})
    assert "detected_language" not in r.json()["translations"][0]


async def test_v1_translate_auto_refuses_a_language_it_cannot_translate_by_name(served: Served) -> None:
    body = {"text": [ENGLISH, FRENCH], "source_language": "auto"}
    r = await served.client.post("/v1/translate", json=body)
    assert r.status_code == 422
    error = error_of(r)
    (detail,) = error["details"]
    assert detail["field"] == "text[1]" and detail["type"] == "unsupported_detected_language"
    assert "detected as French (fr, confidence" in detail["message"]
    assert served.translator.hooks.batches == []
