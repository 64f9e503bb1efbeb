"""POST /v1/translate: happy paths, validation (422 with field and limit), per-request contract."""

from __future__ import annotations

from typing import Any

import pytest

from service.engine.base import TranslateItem, Translation
from tests.service.api.conftest import Served, error_of, serving
from tests.service.small_engines import ReverseTranslator

pytestmark = pytest.mark.anyio


async def test_one_text(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "a man rides a bike"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == served.translator.manifest.name
    assert (body["source_language"], body["target_language"]) == ("en", "de")
    [translation] = body["translations"]
    [best] = translation["hypotheses"]
    assert best["text"] == "BIKE a rides man a"
    assert "tokens" not in best and "alignment" not in best  # only with alignments
    assert body["usage"] == {"input_tokens": 6, "output_tokens": 6}


async def test_a_list_n_best_and_alignments(served: Served) -> None:
    r = await served.client.post(
        "/v1/translate",
        json={
            "text": ["one two", "three four five"],
            "beam_size": 3,
            "n_best": 2,
            "alignments": True,
            "source_language": "en",
            "target_language": "de",
        },
    )
    assert r.status_code == 200, r.text
    first, second = r.json()["translations"]
    assert [h["text"] for h in first["hypotheses"]] == ["TWO one", "two ONE"]
    assert first["hypotheses"][0]["score"] > first["hypotheses"][1]["score"]
    assert second["source_tokens"] == ["three", "four", "five"]
    assert second["hypotheses"][0]["tokens"] == ["FIVE", "four", "three"]
    assert second["hypotheses"][0]["alignment"][0] == [0.0, 0.0, 1.0]


async def test_options_reach_the_engine(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "a b c d", "max_length": 2, "beam_size": 1})
    assert r.json()["translations"][0]["hypotheses"][0]["text"] == "D c"


@pytest.mark.parametrize(
    "body, field, limit",
    [
        ({"text": ""}, "text[0]", None),
        ({"text": "   \n"}, "text[0]", None),
        ({"text": ["fine", " "]}, "text[1]", None),
        ({"text": []}, "text", 1),
        ({"text": ["x"] * 9}, "text", 8),  # max_items_per_request = 8 in these tests
        ({"text": ["ok", "y" * 201]}, "text[1]", 200),  # max_chars_per_text = 200
        ({"text": 42}, "text", None),
        ({"text": "hi", "beam_size": "4"}, "beam_size", None),
        ({"text": "hi", "beam_size": 9}, "beam_size", 8),
        ({"text": "hi", "beam_size": 0}, "beam_size", 1),
        ({"text": "hi", "max_length": 513}, "max_length", 512),
        ({"text": "hi", "length_penalty": 2.5}, "length_penalty", 2.0),
        ({"text": "hi", "beam_size": 2, "n_best": 3}, "n_best", 2),
        ({"text": "hi", "alignments": "yes"}, "alignments", None),
        ({"text": "hi", "temperature": 0.7}, "temperature", None),
        ({"text": "hi", "target_language": "fr"}, "target_language", "en→de"),
        ({"text": "hi", "source_language": "de"}, "source_language", "en→de"),
        ({"text": "hi", "source_language": "not a language"}, "source_language", None),
        ({}, "text", None),
    ],
)
async def test_invalid_requests_are_422_naming_the_field(
    served: Served, body: dict[str, Any], field: str, limit: Any
) -> None:
    r = await served.client.post("/v1/translate", json=body)
    assert r.status_code == 422, r.text
    error = error_of(r)
    assert error["type"] == "validation_error"
    fields = [d["field"] for d in error["details"]]
    assert field in fields, error
    assert error["message"].startswith(error["details"][0]["field"])
    if limit is not None:
        detail = next(d for d in error["details"] if d["field"] == field)
        assert detail["limit"] == limit, detail
    assert served.translator.hooks.batches == []  # nothing reached the engine


async def test_unknown_language_message_lists_the_served_ones(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "hi", "target_language": "fr"})
    assert "'fr' is not served" in r.json()["error"]["message"]
    assert "de" in r.json()["error"]["message"]


async def test_invalid_json_is_422(served: Served) -> None:
    r = await served.client.post(
        "/v1/translate", content=b'{"text": "a"', headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422
    assert "invalid JSON" in error_of(r)["message"]


async def test_an_item_failing_in_the_engine_is_a_500_with_a_request_id(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": ["fine", "this will FAIL"]})
    assert r.status_code == 500
    error = error_of(r)
    assert error["type"] == "internal_error"
    assert "text[1]" in error["message"]
    assert error["request_id"] == r.headers["X-Request-ID"]


async def test_a_request_without_length_penalty_gets_the_models() -> None:
    """The artefact's length penalty (its generation config, tuned on the model's validation
    set) is the default of /v1/translate and LibreTranslate's /translate; a request's own wins."""
    translator = ReverseTranslator(name="tuned-en-de", length_penalty=1.5)
    seen: list[float] = []
    original = translator.translate

    def spy(items: list[TranslateItem]) -> list[Translation | Exception]:
        seen.extend(item.options.length_penalty for item in items)
        return original(items)

    translator.translate = spy  # type: ignore[method-assign]
    async with serving(given=[translator]) as served:
        client = served.client
        assert (await client.post("/v1/translate", json={"text": "a b", "beam_size": 4})).status_code == 200
        assert seen == [1.5]
        body = {"text": "a b", "beam_size": 4, "length_penalty": 0.5}
        assert (await client.post("/v1/translate", json=body)).status_code == 200
        assert seen == [1.5, 0.5]
        # another text: "a b" at these options is in the translation cache and would not reach the engine
        assert (
            await client.post("/translate", json={"q": "c d", "source": "en", "target": "de"})
        ).status_code == 200
        assert seen == [1.5, 0.5, 1.5]
        (card,) = (await client.get("/v1/models")).json()["data"]
        assert card["length_penalty"] == 1.5
