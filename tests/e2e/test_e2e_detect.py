"""Language detection against the real service, driven by LibreTranslate's own Python client
(``libretranslatepy``): ``detect``, and ``translate`` with ``source="auto"`` into each language."""

from __future__ import annotations

import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.servers import ServerProcess

pytestmark = pytest.mark.slow


def test_libretranslatepy_detects_the_served_languages(service: ServerProcess) -> None:
    lt = LibreTranslateAPI(service.url)
    english = lt.detect("A man is riding a bicycle down the street.")
    german = lt.detect("Ein Mann fährt mit dem Fahrrad die Straße hinunter.")
    assert english[0]["language"] == "en" and english[0]["confidence"] > 90
    assert german[0]["language"] == "de" and german[0]["confidence"] > 90
    assert {c["language"] for c in english} == {"en", "de"}


def test_libretranslatepy_translates_from_auto_both_ways(service: ServerProcess) -> None:
    lt = LibreTranslateAPI(service.url)
    assert "hund" in lt.translate("Two dogs are playing in the snow.", source="auto", target="de").lower()
    assert "dog" in lt.translate("Zwei Hunde spielen im Schnee.", source="auto", target="en").lower()


def test_auto_into_the_texts_own_language_is_refused_by_name(client: httpx.Client) -> None:
    german_into_german = {"q": "Zwei Hunde spielen im Schnee.", "source": "auto", "target": "de"}
    r = client.post("/translate", json=german_into_german)
    assert r.status_code == 400
    assert "detected as German (de" in r.json()["error"]


def test_v1_auto_translates_a_mixed_list_each_text_by_its_model(client: httpx.Client) -> None:
    body = {
        "text": ["Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee."],
        "source_language": "auto",
        "target_language": "de",
    }
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 422  # German into German: no model
    body["target_language"] = "en"
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 422  # English into English: no model
    r = client.post("/v1/translate", json={"text": body["text"], "source_language": "auto"})
    assert r.status_code == 200, r.text
    translations = r.json()["translations"]
    assert [t["detected_language"]["language"] for t in translations] == ["en", "de"]
    assert "hund" in translations[0]["hypotheses"][0]["text"].lower()
    assert "dog" in translations[1]["hypotheses"][0]["text"].lower()
