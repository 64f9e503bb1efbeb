"""The playground's glossary box and kept spans in Debian's chromium (Playwright): the page's
term matching is the service's, typed entries become one glossary of the key (reused, replaced
when edited), saved glossaries are offered for the pair, the glossary routes' errors are shown,
and, with the real default model, a required term and a kept span come back marked.

The small NumPy translator keeps spans (it copies its tokens) but does not enforce terms; the
real default model does both, so the term itself is checked against it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, Request, expect, sync_playwright

from service.glossaries.entries import Entry
from service.glossaries.matching import TermMatcher
from service.serving.terminology import SentenceTerms
from tests.e2e.real_models import served_env, start_service
from tests.servers import ServerProcess, server_process, small_server_command

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (.ci/install-tools.sh installs it with apt-get)",
)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("playground-glossary-server") / "server.log"
    env = {"TSERVE_GLOSSARY_DIR": str(tmp_path_factory.mktemp("glossaries"))}
    with server_process(small_server_command(), env, log) as s:
        yield s


@pytest.fixture
def page() -> Iterator[Page]:
    """A fresh browser page; any uncaught script error fails the test."""
    assert CHROMIUM is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        yield page
        browser.close()
    assert not errors, f"script errors on the page: {errors}"


@pytest.fixture
def clean(small_server: ServerProcess) -> Iterator[None]:
    """Each test starts and ends without glossaries."""
    yield
    for g in httpx.get(f"{small_server.url}/v1/glossaries").json()["glossaries"]:
        httpx.delete(f"{small_server.url}/v1/glossaries/{g['id']}")


def open_terminology(page: Page, server: ServerProcess) -> None:
    page.goto(f"{server.url}/")
    expect(page.locator("#models .model")).to_have_count(2)
    page.click("#terminology summary")
    expect(page.locator("#glossary-entries")).to_be_visible()


def in_page(page: Page, expression: str, args: Any) -> Any:
    """``expression`` over ``t``, the page's own terms.js module, and ``args``."""
    return page.evaluate(
        f"async (args) => {{ const t = await import('/playground/terms.js'); return {expression}; }}", args
    )


ENTRIES = [
    Entry("shopping cart", "Warenkorb"),
    Entry("cart", "Karren"),
    Entry("sign in", "Anmelden", case_sensitive=False),
    Entry("dog", "Hund"),
    Entry("Straße", "street"),
    Entry("snow", "Schnee", whole_word=False),
    Entry("İstanbul", "Istanbul", case_sensitive=False),
]
SENTENCES = [
    "Sign in to see the shopping cart of {user}.",
    "SIGN IN, then the cart; the carts are full.",
    "A dog, two dogs, a hotdog and dog_food and 3dog.",
    "Die Straße, die Straßenbahn, die straße.",
    "Snowy snowfields: snow everywhere.",
    "i̇stanbul and İSTANBUL and ISTANBUL.",
    "The {user} has a dog in the shopping cart {user}dog.",
    "Keep @ and % here: a dog.",
]
KEPT = ["{user}", "shopping cart {user}", "dog_food", "%"]


def test_the_page_finds_the_terms_and_spans_the_service_requires(
    page: Page, small_server: ServerProcess
) -> None:
    """terms.js against service/glossaries itself, on terms at word edges, in other cases,
    inside kept spans, and overlapping."""
    page.goto(f"{small_server.url}/")
    entries = [
        {
            "source": e.source,
            "target": e.target,
            "case_sensitive": e.case_sensitive,
            "whole_word": e.whole_word,
        }
        for e in ENTRIES
    ]
    found = in_page(
        page,
        "args.sentences.map(s => { const r = t.requiredOf(s, args.entries, args.kept);"
        " return {terms: [...new Set(r.entries.map(e => e.target))], kept: r.kept}; })",
        {"sentences": SENTENCES, "entries": entries, "kept": KEPT},
    )
    terms = SentenceTerms(TermMatcher(ENTRIES), tuple(KEPT))
    for sentence, page_found in zip(SENTENCES, found, strict=True):
        masked, required = terms.prepare(sentence)
        service_terms = [phrase for phrase, _ in required if phrase not in masked.placeholders]
        assert page_found["terms"] == service_terms, sentence
        assert sorted(page_found["kept"]) == sorted({span for _, span in masked.kept}), sentence
    assert found[2]["terms"] == ["Hund"] and found[6]["kept"] == ["shopping cart {user}", "{user}"]


def test_the_boxes_are_read_as_documented(page: Page, small_server: ServerProcess) -> None:
    page.goto(f"{small_server.url}/")
    typed = "shopping cart = Warenkorb\n\n sign in\tAnmelden \nequation = a=b\n"
    assert in_page(page, "t.parseEntries(args)", typed) == [
        {"source": "shopping cart", "target": "Warenkorb"},
        {"source": "sign in", "target": "Anmelden"},
        {"source": "equation", "target": "a=b"},
    ]
    for broken, line in (("ok = fine\nno separator", 2), (" = Warenkorb", 1), ("cart =  ", 1)):
        message = in_page(
            page, "(() => { try { t.parseEntries(args); } catch (e) { return e.message; } })()", broken
        )
        assert message.startswith(f"Glossary line {line}:"), message
    assert in_page(page, "t.parseKept(args)", "{count}, ACME Cloud ,{count}") == ["{count}", "ACME Cloud"]
    assert in_page(page, "t.parseKept(args)", "Smith, Inc.\n{n}\n\n") == ["Smith, Inc.", "{n}"]
    pieces = in_page(
        page,
        "t.markedPieces(args, [{source: 'cart', target: 'Korb'},"
        " {source: 'shopping cart', target: 'Warenkorb'}], ['{n}'])",
        "Warenkorb: {n} Korb.",
    )
    assert [(p["text"], p.get("kind")) for p in pieces] == [
        ("Warenkorb", "term"),  # the longer of two overlapping marks
        (": ", None),
        ("{n}", "kept"),
        (" ", None),
        ("Korb", "term"),
        (".", None),
    ]


def translate(page: Page) -> None:
    """Click Translate and wait for the translation's answer."""
    with page.expect_response(lambda r: r.url.endswith("/v1/translate")):
        page.click("#translate-button")


def glossary_calls(page: Page) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []

    def seen(r: Request) -> None:
        if "/v1/glossaries" in r.url and r.method != "GET":
            calls.append((r.method, r.url.rsplit("/v1/", 1)[1]))

    page.on("request", seen)
    return calls


def test_typed_entries_become_one_glossary_reused_and_replaced_when_edited(
    page: Page, small_server: ServerProcess, clean: None
) -> None:
    calls = glossary_calls(page)
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/v1/translate") else None)
    open_terminology(page, small_server)
    page.fill("#glossary-entries", "dogs = Hunde")
    page.fill("#keep-spans", "{n}, ACME")
    page.fill("#translate-text", "Two dogs of ACME sleep. {n} cats play.")
    translate(page)
    listed = httpx.get(f"{small_server.url}/v1/glossaries").json()["glossaries"]
    assert len(listed) == 1 and listed[0]["name"].startswith("playground-")
    assert sent[-1]["glossary"] == listed[0]["id"] and sent[-1]["keep"] == ["{n}", "ACME"]
    # The small translator keeps spans (not terms): each kept span is marked where it came back.
    kept = page.locator(".sentence .nbest li:first-child mark.kept")
    expect(kept).to_have_text(["ACME", "{n}"])
    expect(page.locator(".terms-legend")).to_be_visible()
    expect(page.locator("#glossary-choice option")).to_have_count(2)  # typed, and the one made

    translate(page)  # the same entries: the same glossary, nothing created
    assert calls == [("POST", "glossaries")]

    page.fill("#glossary-entries", "dogs = Hunde\ncats = Katzen")
    translate(page)
    expect(page.locator("#glossary-choice option")).to_have_count(2)
    after = httpx.get(f"{small_server.url}/v1/glossaries").json()["glossaries"]
    assert [g["entry_count"] for g in after] == [2]  # the first one was deleted, not piled up
    assert calls == [
        ("POST", "glossaries"),
        ("POST", "glossaries"),
        ("DELETE", f"glossaries/{listed[0]['id']}"),
    ]


def test_a_saved_glossary_of_the_pair_is_offered_and_its_entries_shown(
    page: Page, small_server: ServerProcess, clean: None
) -> None:
    made = httpx.post(
        f"{small_server.url}/v1/glossaries",
        json={
            "name": "shop",
            "source_language": "en",
            "target_language": "de",
            "entries": [{"source": "cart", "target": "Korb"}, {"source": "dog", "target": "Hund"}],
        },
    ).json()
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/v1/translate") else None)
    open_terminology(page, small_server)
    page.fill("#glossary-entries", "my own = typed")
    expect(page.locator("#glossary-choice option")).to_have_text(
        ["the entries typed below", "shop (2 entries)"]
    )
    page.select_option("#glossary-choice", made["id"])
    box = page.locator("#glossary-entries")
    expect(box).to_have_value("cart = Korb\ndog = Hund")
    expect(box).to_have_attribute("readonly", "")
    page.fill("#translate-text", "A dog.")
    page.click("#translate-button")
    expect(page.locator(".sentence")).to_have_count(1)
    assert sent[-1]["glossary"] == made["id"]
    page.select_option("#glossary-choice", "")
    expect(box).to_have_value("my own = typed")  # the typed entries come back
    expect(box).not_to_have_attribute("readonly", "")


def test_the_glossary_routes_errors_are_shown_in_the_panel(
    page: Page, small_server: ServerProcess, clean: None
) -> None:
    open_terminology(page, small_server)
    error = page.locator("#translate-error")
    page.fill("#glossary-entries", "fine = gut\nno separator here")
    page.click("#translate-button")
    expect(error).to_have_text(
        'Glossary line 2: write "source term = target term" (or the two terms separated by a tab).'
    )
    # Over TSERVE_GLOSSARY_MAX_TERM_CHARS (200); the API's entries[1] is the box's line 3.
    page.fill("#glossary-entries", f"fine = gut\n\n{'x' * 201} = y")
    page.click("#translate-button")
    expect(error).to_contain_text("422 validation_error")
    expect(error.locator("li")).to_have_text(
        ["entries[1].source (line 3): a term of 201 characters, longer than 200"]
    )
    page.fill("#glossary-entries", "dog = Hund\ndog = Hündchen")
    page.click("#translate-button")
    expect(error).to_contain_text("422 validation_error")
    expect(error).to_contain_text("entries[1] (line 2): the source term 'dog' is given more than once")
    page.fill("#glossary-entries", "dog = Hund\nDog = Hund")
    page.click("#translate-button")
    expect(page.locator(".sentence")).to_have_count(3)  # case-sensitive terms: two entries, no error
    expect(error).to_be_hidden()

    made = httpx.post(
        f"{small_server.url}/v1/glossaries",
        json={
            "name": "gone",
            "source_language": "en",
            "target_language": "de",
            "entries": [{"source": "cat", "target": "Katze"}],
        },
    ).json()
    page.click("#terminology summary")
    page.click("#terminology summary")  # opened again: listed again
    page.select_option("#glossary-choice", made["id"])
    expect(page.locator("#glossary-entries")).to_have_value("cat = Katze")
    httpx.delete(f"{small_server.url}/v1/glossaries/{made['id']}")
    page.click("#translate-button")
    expect(error).to_contain_text("404 glossary_not_found")


@pytest.fixture(scope="module")
def real_service(
    default_artefacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = served_env(
        default_artefacts, "fp32", TSERVE_GLOSSARY_DIR=str(tmp_path_factory.mktemp("glossaries"))
    )
    yield from start_service(tmp_path_factory, "service-playground-glossary", env)


@pytest.mark.slow
def test_the_real_model_holds_the_term_and_the_span_and_the_page_marks_both(
    page: Page, real_service: ServerProcess, tmp_path: Path
) -> None:
    responses: list[Any] = []
    page.on("response", lambda r: responses.append(r) if r.url.endswith("/v1/translate") else None)
    page.goto(f"{real_service.url}/")
    expect(page.locator("#translate-model option").first).to_have_text("transformer-en-de (en→de)")
    page.click("#terminology summary")
    page.fill("#glossary-entries", "bicycle = Drahtesel")
    page.fill("#keep-spans", "{count}")
    page.fill("#translate-text", "A man with {count} dogs is riding a bicycle.")
    page.fill("#beam-size", "4")
    page.fill("#n-best", "1")
    page.click("#translate-button")
    best = page.locator(".sentence .nbest li").first
    expect(best.locator("mark.term")).to_have_text(["Drahtesel"])
    expect(best.locator("mark.kept")).to_have_text(["{count}"])
    expect(best.locator("mark.term")).to_have_attribute("title", "glossary: bicycle → Drahtesel")
    text = json.loads(responses[-1].text())["translations"][0]["hypotheses"][0]["text"]
    assert "Drahtesel" in text and "{count}" in text and "@" not in text
    expect(best.locator(".hypothesis")).to_have_text(text)  # marked, not changed
    page.screenshot(path=tmp_path / "glossary-real-model.png", full_page=True)


def test_the_keyboard_opens_the_fields_and_reaches_each(page: Page, small_server: ServerProcess) -> None:
    page.goto(f"{small_server.url}/")
    expect(page.locator("#models .model")).to_have_count(2)
    page.focus("#translate-text")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.tagName") == "SUMMARY"
    page.keyboard.press("Enter")
    expect(page.locator("#terminology")).to_have_attribute("open", "")
    reached = []
    for _ in range(4):
        page.keyboard.press("Tab")
        reached.append(page.evaluate("document.activeElement.id"))
    assert reached == ["glossary-choice", "glossary-entries", "keep-spans", "beam-size"]


def test_at_400_px_the_open_fields_and_marked_output_fit(page: Page, small_server: ServerProcess) -> None:
    page.set_viewport_size({"width": 400, "height": 900})
    open_terminology(page, small_server)
    page.fill("#keep-spans", "ACME Cloud, {count}")
    page.fill("#translate-text", "ACME Cloud has {count} users in many countries around the world today.")
    translate(page)
    expect(page.locator(".sentence .nbest li:first-child mark.kept")).to_have_text(
        ["{count}", "ACME Cloud"]
    )  # the small model reverses
    widths = page.evaluate(
        "({page: document.documentElement.scrollWidth, view: document.documentElement.clientWidth})"
    )
    assert widths["page"] <= widths["view"], widths
