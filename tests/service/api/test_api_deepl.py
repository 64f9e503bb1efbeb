"""DeepL's API (/v2): its bodies (forms and JSON), key header, language codes, glossaries from
TSV and CSV, and its error shape ``{"message": ...}`` with its statuses."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from service.engine.base import Engine
from tests.service.api.conftest import Served, serving, small_settings
from tests.service.api.keeping_translator import KeepingTranslator
from tests.service.small_engines import HashEmbedder

pytestmark = pytest.mark.anyio
_names = itertools.count()
KEY = {"Authorization": "DeepL-Auth-Key key-a"}
TSV = "cart\tWarenkorb\nsign in\tAnmelden\n"


def deepl_app(**settings: Any) -> Any:
    n = next(_names)
    given: dict[str, Engine] = {
        "embed": HashEmbedder(name=f"d-embed-{n}"),
        "translate": KeepingTranslator(name=f"d-{n}"),
    }
    return serving(small_settings(api_keys=["key-a", "key-b"], **settings), given)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with deepl_app() as s:
        yield s


def message(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"message"} and isinstance(body["message"], str), body
    text: str = body["message"]
    return text


async def glossary(client: httpx.AsyncClient, **fields: str) -> dict[str, Any]:
    body = {"name": "shop", "source_lang": "EN", "target_lang": "DE", "entries": TSV, **fields}
    r = await client.post("/v2/glossaries", json=body, headers=KEY)
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()
    return made


async def test_translate_a_form_with_repeated_text(served: Served) -> None:
    form = {"text": ["one two.", "three"], "target_lang": "DE", "source_lang": "EN"}
    r = await served.client.post("/v2/translate", data=form, headers=KEY)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "translations": [
            {"detected_source_language": "EN", "text": "TWO. one", "billed_characters": 8},
            {"detected_source_language": "EN", "text": "THREE", "billed_characters": 5},
        ]
    }


async def test_translate_json_with_a_glossary_and_html(served: Served) -> None:
    made = await glossary(served.client)
    assert (made["source_lang"], made["target_lang"], made["entry_count"], made["ready"]) == (
        "en",
        "de",
        2,
        True,
    )
    body = {
        "text": ["<p>the cart</p>"],
        "source_lang": "EN",
        "target_lang": "DE",
        "glossary_id": made["glossary_id"],
        "tag_handling": "html",
        "split_sentences": "nonewlines",
        "preserve_formatting": True,
    }
    r = await served.client.post("/v2/translate", json=body, headers=KEY)
    assert r.status_code == 200, r.text
    assert r.json()["translations"][0]["text"] == "<p>CART the Warenkorb</p>"


async def test_glossaries_from_csv_listed_read_as_tsv_and_deleted(served: Served) -> None:
    made = await glossary(served.client, entries='"a, b",c\nd,e\n', entries_format="csv")
    listed = (await served.client.get("/v2/glossaries", headers=KEY)).json()
    assert listed == {"glossaries": [made]}
    assert (await served.client.get(f"/v2/glossaries/{made['glossary_id']}", headers=KEY)).json() == made
    entries = await served.client.get(f"/v2/glossaries/{made['glossary_id']}/entries", headers=KEY)
    assert entries.headers["content-type"].startswith("text/tab-separated-values")
    assert entries.text == "a, b\tc\nd\te"
    deleted = await served.client.delete(f"/v2/glossaries/{made['glossary_id']}", headers=KEY)
    assert deleted.status_code == 204
    message(await served.client.get(f"/v2/glossaries/{made['glossary_id']}", headers=KEY), 404)
    message(await served.client.delete(f"/v2/glossaries/{made['glossary_id']}", headers=KEY), 404)


async def test_another_key_sees_none_of_them(served: Served) -> None:
    made = await glossary(served.client)
    other = {"Authorization": "DeepL-Auth-Key key-b"}
    assert (await served.client.get("/v2/glossaries", headers=other)).json() == {"glossaries": []}
    body = {"text": ["cart"], "source_lang": "EN", "target_lang": "DE", "glossary_id": made["glossary_id"]}
    assert "no glossary" in message(await served.client.post("/v2/translate", json=body, headers=other), 404)


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        ({"entries": "cart Warenkorb"}, 400, "line 1"),
        ({"entries": 'a,"b', "entries_format": "csv"}, 400, "CSV"),
        ({"entries": "x" * 21 + "\ty"}, 400, "longer than 20"),
        ({"entries": "a\tb\nc\td\ne\tf\ng\th"}, 400, "more than the 3"),
        ({"target_lang": "FR"}, 400, "no model translates en→fr"),
        ({"entries_format": "xlsx"}, 400, "entries_format"),
    ],
)
async def test_bad_glossaries_are_400_with_a_message(fields: dict[str, str], status: int, words: str) -> None:
    async with deepl_app(glossary_max_entries=3, glossary_max_term_chars=20) as s:
        body = {"name": "g", "source_lang": "EN", "target_lang": "DE", "entries": TSV, **fields}
        assert words in message(await s.client.post("/v2/glossaries", data=body, headers=KEY), status)


async def test_full_glossaries_are_deepls_456() -> None:
    async with deepl_app(glossary_max_count=1) as s:
        await glossary(s.client)
        assert "limit of 1" in message(
            await s.client.post(
                "/v2/glossaries",
                json={"name": "two", "source_lang": "EN", "target_lang": "DE", "entries": TSV},
                headers=KEY,
            ),
            456,
        )


async def test_translate_errors_in_deepls_shape(served: Served) -> None:
    body: dict[str, Any] = {"text": ["a"], "target_lang": "DE", "source_lang": "EN"}
    assert "Authorization" in message(await served.client.post("/v2/translate", json=body), 403)
    wrong = {"Authorization": "DeepL-Auth-Key nope"}
    message(await served.client.post("/v2/translate", json=body, headers=wrong), 403)
    unserved = {**body, "target_lang": "JA"}
    refused = message(await served.client.post("/v2/translate", json=unserved, headers=KEY), 400)
    assert refused.startswith("target_lang: 'ja' is not served"), refused  # DeepL's field name
    from_unserved = {**body, "source_lang": "JA"}
    refused = message(await served.client.post("/v2/translate", json=from_unserved, headers=KEY), 400)
    assert refused.startswith("source_lang: "), refused
    no_source = {"text": ["a"], "target_lang": "DE", "glossary_id": "x"}
    assert "source_lang" in message(
        await served.client.post("/v2/translate", json=no_source, headers=KEY), 400
    )
    unknown = {**body, "glossary_id": "no-such-id"}
    message(await served.client.post("/v2/translate", json=unknown, headers=KEY), 404)
    formal = {**body, "formality": "more"}
    assert "formality" in message(await served.client.post("/v2/translate", json=formal, headers=KEY), 400)
    xml = {**body, "tag_handling": "xml"}
    message(await served.client.post("/v2/translate", json=xml, headers=KEY), 400)
    message(
        await served.client.post(
            "/v2/translate", content=b"{", headers={**KEY, "content-type": "application/json"}
        ),
        400,
    )


async def test_languages_pairs_and_usage(served: Served) -> None:
    sources = await served.client.get("/v2/languages", headers=KEY)
    assert sources.json() == [{"language": "EN", "name": "English"}]
    targets = await served.client.get("/v2/languages", params={"type": "target"}, headers=KEY)
    assert targets.json() == [{"language": "DE", "name": "German", "supports_formality": False}]
    as_form = await served.client.request("GET", "/v2/languages", data={"type": "target"}, headers=KEY)
    assert as_form.json() == targets.json()  # the deepl client sends it in a GET's body
    pairs = (await served.client.get("/v2/glossary-language-pairs", headers=KEY)).json()
    assert pairs == {"supported_languages": [{"source_lang": "en", "target_lang": "de"}]}
    body = {"text": ["abc", "de"], "target_lang": "DE", "source_lang": "EN"}
    await served.client.post("/v2/translate", json=body, headers=KEY)
    usage = (await served.client.get("/v2/usage", headers=KEY)).json()
    assert usage == {"character_count": 5, "character_limit": 1_000_000_000_000}


@pytest.mark.parametrize(
    "method, path, headers, status",
    [
        ("GET", "/v2/translate", {}, 405),
        ("GET", "/v2/unknown", {}, 404),
        ("GET", "/v2/glossaries/" + "x" * 300, {}, 400),  # longer than any glossary_id
        # a form the parser cannot read, on a route that takes a body only optionally
        ("POST", "/v2/languages", {"Content-Type": "multipart/form-data; boundary=x"}, 400),
        ("POST", "/v2/usage", {"Content-Type": "multipart/form-data; boundary=x"}, 400),
    ],
)
async def test_what_http_refuses_under_v2_is_in_deepl_s_shape(
    served: Served, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    sent = b"--x\r\nContent-Disposition: form-data\r\n\r\nv\r\n--x--\r\n"  # a part with no name
    r = await served.client.request(method, path, headers={**KEY, **headers}, content=sent)
    assert message(r, status)
