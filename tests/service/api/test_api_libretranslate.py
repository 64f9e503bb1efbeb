"""LibreTranslate's API: /translate (JSON and forms), /languages, /frontend/settings, its errors."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.service.api.conftest import Served, metric, serving, small_settings

pytestmark = pytest.mark.anyio


def lt_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    message: str = body["error"]
    return message


async def test_json_one_string(served: Served) -> None:
    r = await served.client.post(
        "/translate", json={"q": "one two. Three four.", "source": "en", "target": "de"}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": "TWO. one FOUR. Three"}


async def test_json_list_html_and_alternatives(served: Served) -> None:
    r = await served.client.post(
        "/translate",
        json={
            "q": ["a b", "<p>c d</p>"],
            "source": "en",
            "target": "de",
            "format": "html",
            "alternatives": 1,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "translatedText": ["B a", "<p>D c</p>"],
        "alternatives": [["b A"], ["<p>d C</p>"]],
    }


async def test_url_encoded_form_as_libretranslatepy_sends_it(served: Served) -> None:
    r = await served.client.post(
        "/translate", data={"q": "a b c", "source": "en", "target": "de", "alternatives": "1"}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": "C b a", "alternatives": ["c B a"]}


async def test_multipart_form_with_repeated_q(served: Served) -> None:
    fields = [("q", "a b"), ("q", "c d"), ("source", "en"), ("target", "de")]
    body = "".join(f'--xyz\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields)
    r = await served.client.post(
        "/translate",
        content=(body + "--xyz--\r\n").encode(),
        headers={"Content-Type": "multipart/form-data; boundary=xyz"},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": ["B a", "D c"]}


async def test_auto_reports_the_language_detected(served: Served) -> None:
    r = await served.client.post("/translate", json={"q": "A dog runs", "source": "auto", "target": "de"})
    answer = r.json()
    assert answer["translatedText"] == "RUNS dog A"
    assert answer["detectedLanguage"]["language"] == "en" and answer["detectedLanguage"]["confidence"] > 90
    both = {"q": ["A dog", "Ein Hund"], "source": "auto", "target": "de"}
    r = await served.client.post("/translate", json=both)
    assert r.status_code == 400  # the German text: no model translates German into German
    assert r.json()["error"].startswith("Invalid request: q.1: detected as German (de, confidence")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"source": "en", "target": "de"}, "q"),
        ({"q": 42, "source": "en", "target": "de"}, "q"),
        ({"q": "hi", "target": "de"}, "source"),
        ({"q": "hi", "source": "fr", "target": "de"}, "fr is not supported"),
        ({"q": "hi", "source": "en", "target": "es"}, "es is not supported"),
        ({"q": "hi", "source": "en", "target": "de", "format": "markdown"}, "format"),
        ({"q": "hi", "source": "en", "target": "de", "alternatives": 99}, "alternatives"),
        ({"q": "<p>hi</b>", "source": "en", "target": "de", "format": "html"}, "q.0"),
        ({"q": ["x"] * 9, "source": "en", "target": "de"}, "at most 8 texts"),
        ({"q": "y" * 201, "source": "en", "target": "de"}, "200"),
    ],
)
async def test_bad_requests_are_400_in_libretranslates_shape(
    served: Served, body: dict[str, Any], needle: str
) -> None:
    message = lt_error(await served.client.post("/translate", json=body), 400)
    assert needle in message
    assert served.translator.hooks.batches == []


async def test_not_json_nor_a_form_is_415(served: Served) -> None:
    r = await served.client.post("/translate", content=b"q=hi", headers={"Content-Type": "text/plain"})
    lt_error(r, 415)


async def test_invalid_json_is_400(served: Served) -> None:
    r = await served.client.post(
        "/translate", content=b'{"q": "a"', headers={"Content-Type": "application/json"}
    )
    assert "invalid JSON" in lt_error(r, 400)


@pytest.mark.parametrize("path", ["/translate", "/detect"])
async def test_a_number_too_long_to_convert_is_400_not_500(path: str) -> None:
    """json's int() refuses more than sys.get_int_max_str_digits() digits with a ValueError."""
    body = b'{"q": "a", "source": "en", "target": "de", "alternatives": ' + b"9" * 4301 + b"}"
    async with serving(small_settings(max_body_bytes=16384)) as served:
        r = await served.client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert "digits" in lt_error(r, 400)
        assert served.translator.hooks.batches == []


async def test_detect_refuses_a_body_too_large_in_libretranslates_shape(served: Served) -> None:
    r = await served.client.post("/detect", json={"q": "a" * 5000})
    assert "larger than" in lt_error(r, 413)


async def test_api_key_in_the_body_the_query_or_a_bearer_token() -> None:
    async with serving(small_settings(api_keys=["k1"])) as served:
        body = {"q": "a b", "source": "en", "target": "de"}
        assert "required" in lt_error(await served.client.post("/translate", json=body), 403)
        wrong = {**body, "api_key": "nope"}
        assert lt_error(await served.client.post("/translate", json=wrong), 403) == "Invalid API key"
        assert (await served.client.post("/translate", json={**body, "api_key": "k1"})).status_code == 200
        assert (await served.client.post("/translate", data={**body, "api_key": "k1"})).status_code == 200
        bearer = {"Authorization": "Bearer k1"}
        assert (await served.client.post("/translate", json=body, headers=bearer)).status_code == 200


async def test_with_keys_the_page_loads_before_a_key_is_entered() -> None:
    """LibreTranslate serves its languages and settings to anyone; only what costs needs the key."""
    async with serving(small_settings(api_keys=["k1"])) as served:
        assert (await served.client.get("/languages")).status_code == 200
        settings = (await served.client.get("/frontend/settings")).json()
        assert settings["keyRequired"] is True and settings["apiKeys"] is True
        assert "required" in lt_error(await served.client.post("/detect", json={"q": "a b"}), 403)
        refused = await served.client.post("/translate_file", data={"source": "en", "target": "de"})
        assert lt_error(refused, 403)


async def test_suggest_is_refused_as_libretranslate_refuses_it(served: Served) -> None:
    r = await served.client.post("/suggest", json={"q": "a", "s": "b", "source": "en", "target": "de"})
    assert lt_error(r, 403) == "Suggestions are disabled on this server."


async def test_queue_full_is_429_with_retry_after() -> None:
    settings = small_settings(max_queue=8, max_batch_size=1)
    async with serving(settings, delay_s=0.3) as served:
        first = asyncio.create_task(
            served.client.post("/translate", json={"q": ["a"] * 8, "source": "en", "target": "de"})
        )
        await asyncio.sleep(0.1)
        r = await served.client.post("/translate", json={"q": ["b", "c"], "source": "en", "target": "de"})
        lt_error(r, 429)
        assert int(r.headers["Retry-After"]) >= 1
        first.cancel()


async def test_not_ready_is_503_in_its_shape() -> None:
    async with serving(wait_ready=False, warmup_s=1.0) as served:
        r = await served.client.post("/translate", json={"q": "a", "source": "en", "target": "de"})
        assert "not ready" in lt_error(r, 503)


async def test_languages_lists_the_served_pairs(served: Served) -> None:
    r = await served.client.get("/languages")
    assert r.json() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]


async def test_frontend_settings_give_the_limits(served: Served) -> None:
    settings = (await served.client.get("/frontend/settings")).json()
    assert settings["charLimit"] == served.app.state.runtime.limits.max_translate_chars
    assert settings["keyRequired"] is False
    assert settings["language"]["source"] == {"code": "en", "name": "English"}


async def test_libretranslate_routes_are_counted_in_the_metrics(served: Served) -> None:
    before = metric("tserve_requests_total", endpoint="/translate", status="200")
    await served.client.post("/translate", json={"q": "a", "source": "en", "target": "de"})
    assert metric("tserve_requests_total", endpoint="/translate", status="200") == before + 1


async def test_body_limits_answer_in_its_shape_too() -> None:
    async with serving(small_settings(max_body_bytes=1024)) as served:
        big = {"q": "word " * 400, "source": "en", "target": "de"}
        declared = await served.client.post("/translate", json=big)  # refused from Content-Length
        assert "larger than 1024 bytes" in lt_error(declared, 413)
        assert declared.headers["Connection"] == "close"

        async def streamed() -> Any:
            yield b'{"q": "' + b"w" * 2000 + b'"}'

        chunked = await served.client.post(
            "/translate", content=streamed(), headers={"Content-Type": "application/json"}
        )
        assert "larger than 1024 bytes" in lt_error(chunked, 413)


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/translate", 405),  # LibreTranslate's page and libretranslatepy POST it
        ("PUT", "/detect", 405),
        ("DELETE", "/languages", 405),
        ("GET", "/translate_file", 405),
        ("GET", "/suggest", 405),
        ("GET", "/frontend/unknown", 404),
        ("POST", "/translate/v2", 404),  # a path of its API not served here
        ("GET", "/spec", 404),  # LibreTranslate's OpenAPI document: ours is /openapi.json
        ("POST", "/download_file/x", 405),
        ("GET", "/download_file/" + "x" * 300, 400),  # past the longest name given: its 400
    ],
)
async def test_what_http_refuses_on_its_paths_is_in_its_shape(
    served: Served, method: str, path: str, status: int
) -> None:
    """Its web page shows ``error`` as text: our object would read "[object Object]"."""
    assert lt_error(await served.client.request(method, path), status)


async def test_our_paths_keep_our_shape_for_the_same_refusals(served: Served) -> None:
    for method, path in [("GET", "/v1/translate"), ("GET", "/v1/unknown"), ("GET", "/translated")]:
        r = await served.client.request(method, path)
        assert r.status_code in (404, 405) and isinstance(r.json()["error"], dict), r.text
