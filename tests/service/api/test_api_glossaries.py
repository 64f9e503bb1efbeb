"""/v1/glossaries and glossaries in /v1/translate and LibreTranslate's /translate: each sentence's
matched target terms and kept spans reach the engine as that sentence's required phrases, the
spans come back byte for byte, and bad glossaries are clear 4xx answers."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.engine.base import Engine
from tests.service.api.conftest import Served, error_of, serving, small_settings
from tests.service.api.keeping_translator import KeepingTranslator
from tests.service.small_engines import HashEmbedder

pytestmark = pytest.mark.anyio
_names = itertools.count()
SHOP = {
    "name": "shop",
    "source_language": "en",
    "target_language": "de",
    "entries": [
        {"source": "cart", "target": "Warenkorb"},
        {"source": "sign in", "target": "Anmelden", "case_sensitive": False},
    ],
}


def keeping(**settings: Any) -> Any:
    n = next(_names)
    given: dict[str, Engine] = {
        "embed": HashEmbedder(name=f"g-embed-{n}"),
        "translate": KeepingTranslator(name=f"g-{n}"),
    }
    return serving(small_settings(max_chars_per_text=400, **settings), given)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with keeping() as s:
        yield s


def received(served: Served) -> list[tuple[str, tuple[str, ...]]]:
    assert isinstance(served.translator, KeepingTranslator)
    return [(item.text, item.options.required) for item in served.translator.received]


async def created(client: httpx.AsyncClient, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    r = await client.post("/v1/glossaries", json=body, **kwargs)
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()
    return made


async def test_create_list_read_and_delete(served: Served) -> None:
    made = await created(served.client, SHOP)
    assert made["entry_count"] == 2 and made["source_language"] == "en" and "entries" not in made
    listed = (await served.client.get("/v1/glossaries")).json()
    assert listed == {"glossaries": [made]}
    read = (await served.client.get(f"/v1/glossaries/{made['id']}")).json()
    assert read["entries"][1] == {
        "source": "sign in",
        "target": "Anmelden",
        "case_sensitive": False,
        "whole_word": True,
    }
    assert (await served.client.delete(f"/v1/glossaries/{made['id']}")).status_code == 204
    gone = await served.client.get(f"/v1/glossaries/{made['id']}")
    assert gone.status_code == 404 and error_of(gone)["type"] == "glossary_not_found"
    assert (await served.client.delete(f"/v1/glossaries/{made['id']}")).status_code == 404


async def test_each_sentence_requires_the_terms_it_holds(served: Served) -> None:
    made = await created(served.client, SHOP)
    text = "Open the cart now. Then SIGN IN please. Nothing here."
    r = await served.client.post("/v1/translate", json={"text": text, "glossary": made["id"]})
    assert r.status_code == 200, r.text
    assert sorted(received(served)) == [  # sorted: the queue orders them its own way
        ("Nothing here.", ()),
        ("Open the cart now.", ("Warenkorb",)),
        ("Then SIGN IN please.", ("Anmelden",)),
    ]
    assert isinstance(served.translator, KeepingTranslator)
    sources = sorted(  # each term with the span of the source term it matched, for placing it
        (item.text[start:end], term)
        for item in served.translator.received
        for term, (start, end) in zip(item.options.required, item.options.required_sources, strict=True)
    )
    assert sources == [("SIGN IN", "Anmelden"), ("cart", "Warenkorb")]
    assert r.json()["translations"][0]["hypotheses"][0]["text"] == (
        "NOW. cart the Open Warenkorb PLEASE. IN SIGN Then Anmelden HERE. Nothing"  # word 0 upper-cased
    )


async def test_a_glossary_is_named_for_the_pair_translated(served: Served) -> None:
    await created(served.client, SHOP)
    r = await served.client.post(
        "/v1/translate", json={"text": "the cart", "glossary": "shop", "target_language": "de"}
    )
    assert r.status_code == 200, r.text
    assert received(served) == [("the cart", ("Warenkorb",))]


async def test_kept_spans_are_masked_required_and_restored_byte_for_byte(served: Served) -> None:
    kept = ["{count}", "ACME\u00a0Cloud™"]
    text = "You have {count} items in ACME\u00a0Cloud™ now."
    r = await served.client.post("/v1/translate", json={"text": text, "keep": kept})
    assert r.status_code == 200, r.text
    assert received(served) == [("You have @2@ items in @1@ now.", ("@2@", "@1@"))]
    assert r.json()["translations"][0]["hypotheses"][0]["text"] == (
        "NOW. ACME\u00a0Cloud™ in items {count} have You"
    )


async def test_libretranslate_takes_a_glossary_and_kept_spans(served: Served) -> None:
    made = await created(served.client, SHOP)
    body = {"q": "the cart {x}", "source": "en", "target": "de", "glossary": made["id"], "keep": ["{x}"]}
    r = await served.client.post("/translate", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": "{x} cart the Warenkorb"}
    unknown = await served.client.post("/translate", json={**body, "glossary": "nope"})
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]


async def test_a_term_the_model_cannot_write_is_a_422_naming_the_text(served: Served) -> None:
    made = await created(served.client, {**SHOP, "entries": [{"source": "cart", "target": "{Korb}"}]})
    r = await served.client.post("/v1/translate", json={"text": ["fine", "the cart"], "glossary": made["id"]})
    assert r.status_code == 422, r.text
    error = error_of(r)
    assert [(d["field"], d["type"]) for d in error["details"]] == [("text[1]", "constraint_unsatisfiable")]


async def test_an_unknown_glossary_is_a_404(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "a", "glossary": "no-such-glossary"})
    assert r.status_code == 404 and error_of(r)["type"] == "glossary_not_found"


@pytest.mark.parametrize(
    ("change", "field", "kind"),
    [
        ({"entries": [{"source": "x" * 21, "target": "y"}]}, "entries[0].source", "glossary_invalid"),
        ({"entries": [{"source": f"t{i}", "target": "y"} for i in range(4)]}, "entries", "glossary_invalid"),
        (
            {"entries": [{"source": "a", "target": "b"}, {"source": "a", "target": "c"}]},
            "entries[1]",
            "glossary_invalid",
        ),
        ({"target_language": "fr"}, "target_language", "unsupported_language_pair"),
        ({"source_language": "fr"}, "source_language", "unsupported_language_pair"),
    ],
)
async def test_bad_glossaries_are_422_naming_the_field_and_limit(
    change: dict[str, Any], field: str, kind: str
) -> None:
    async with keeping(glossary_max_entries=3, glossary_max_term_chars=20) as s:
        r = await s.client.post("/v1/glossaries", json={**SHOP, **change})
    assert r.status_code == 422, r.text
    detail = error_of(r)["details"][0]
    assert (detail["field"], detail["type"]) == (field, kind)


async def test_the_glossaries_count_limit_is_a_422_until_one_is_deleted() -> None:
    async with keeping(glossary_max_count=1) as s:
        first = await created(s.client, SHOP)
        r = await s.client.post("/v1/glossaries", json={**SHOP, "name": "other"})
        assert r.status_code == 422 and error_of(r)["details"][0]["type"] == "glossary_full"
        await s.client.delete(f"/v1/glossaries/{first['id']}")
        await created(s.client, {**SHOP, "name": "other"})


async def test_each_api_key_has_its_own_glossaries() -> None:
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    async with keeping(api_keys=["key-a", "key-b"]) as s:
        made = await created(s.client, SHOP, headers=a)
        assert (await s.client.get("/v1/glossaries", headers=b)).json() == {"glossaries": []}
        assert (await s.client.get(f"/v1/glossaries/{made['id']}", headers=b)).status_code == 404
        r = await s.client.post("/v1/translate", json={"text": "cart", "glossary": made["id"]}, headers=b)
        assert r.status_code == 404
        r = await s.client.post("/v1/translate", json={"text": "cart", "glossary": made["id"]}, headers=a)
        assert r.status_code == 200
        assert (await s.client.get("/v1/glossaries")).status_code == 401


async def test_a_restart_keeps_the_glossaries(tmp_path: Path) -> None:
    async with keeping(glossary_dir=tmp_path) as s:
        made = await created(s.client, SHOP)
    async with keeping(glossary_dir=tmp_path) as s:
        assert (await s.client.get(f"/v1/glossaries/{made['id']}")).json()["name"] == "shop"
        r = await s.client.post("/v1/translate", json={"text": "the cart", "glossary": "shop"})
        assert r.status_code == 200 and received(s) == [("the cart", ("Warenkorb",))]


async def test_the_cache_tells_a_constrained_sentence_from_a_plain_one(served: Served) -> None:
    made = await created(served.client, SHOP)
    for body in ({"text": "the cart"}, {"text": "the cart", "glossary": made["id"]}, {"text": "the cart"}):
        r = await served.client.post("/v1/translate", json=body)
        assert r.status_code == 200, r.text
    # the plain sentence twice (the second from the cache), the constrained one on its own
    assert received(served) == [("the cart", ()), ("the cart", ("Warenkorb",))]
