"""The playground in a real browser: Debian's chromium driven by Playwright, against the real server
process (``python -m tests.service.run_small_server``: uvicorn, middleware, routes, queues) over
the small NumPy engines, whose alignments are as large as their token counts.

Screenshots go to pytest's temporary folder, ``<basetemp>/playground-screenshots0/`` (printed
at the start; ``pytest --basetemp DIR`` puts them under DIR).
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, Request, expect, sync_playwright

from tests.servers import ServerProcess, server_process, small_server_command

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (.ci/install-tools.sh installs it with apt-get)",
)

API_KEY = "playground-test-key"
PARAGRAPH = (
    "A man is riding a bicycle down the street. Two dogs play.\n\n"
    "A woman in a red coat is reading a long book in the park."
)
OTHER_PARAGRAPH = "Birds fly south in winter. The old fisherman slowly mends his torn blue nets."
EMBED_SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "A woman plays the violin."]
CAPTIONS = "Multi30k: English descriptions of Flickr photos with their German translations (image captions)"
PAIRS = "datasets named by its model card: snli, multi_nli"


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("playground-screenshots", numbered=True)
    print(f"playground screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Its models say what they were trained on (the busy and keyed servers' do not)."""
    log = tmp_path_factory.mktemp("playground-server") / "server.log"
    said = ["--translate-trained-on", CAPTIONS, "--embed-trained-on", PAIRS]
    with server_process([*small_server_command(), *said], {}, log) as s:
        yield s


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("playground-keyed-server") / "server.log"
    with server_process(small_server_command(), {"TSERVE_API_KEYS": API_KEY}, log) as s:
        yield s


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One item per batch, a second each, a queue of 4 texts: easy to fill."""
    log = tmp_path_factory.mktemp("playground-busy-server") / "server.log"
    env = {
        "TSERVE_MAX_QUEUE": "4",
        "TSERVE_MAX_ITEMS_PER_REQUEST": "4",
        "TSERVE_MAX_BATCH_SIZE": "1",
        "TSERVE_EXPRESS_MAX_TOKENS": "0",
        "TSERVE_WORKER_THREADS": "1",
    }
    with server_process(small_server_command(delay_s=1.0), env, log) as s:
        yield s


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    assert CHROMIUM is not None
    browser = playwright.chromium.launch(executable_path=CHROMIUM)
    yield browser
    browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page (own session storage); any uncaught script error fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"script errors on the page: {errors}"


def open_playground(page: Page, server: ServerProcess) -> None:
    response = page.goto(f"{server.url}/")
    assert response is not None and response.status == 200
    expect(page.locator("#models .model")).to_have_count(2)


def translate(page: Page, text: str, *, beam_size: int = 4, n_best: int = 2) -> None:
    page.fill("#translate-text", text)
    page.fill("#beam-size", str(beam_size))
    page.fill("#n-best", str(n_best))
    page.click("#translate-button")


def heatmap_shapes(page: Page) -> list[dict[str, Any]]:
    """Per heatmap: its declared size, the cells and axis labels actually drawn, and the weights."""
    shapes: list[dict[str, Any]] = page.eval_on_selector_all(
        ".heatmap",
        """tables => tables.map(t => ({
            rows: Number(t.dataset.rows),
            cols: Number(t.dataset.cols),
            cellsPerRow: [...t.tBodies[0].rows].map(r => r.querySelectorAll("td").length),
            targetLabels: [...t.querySelectorAll("th.target-token")].map(th => th.textContent),
            sourceLabels: [...t.querySelectorAll("th.source-token")].map(th => th.textContent),
            weights: [...t.tBodies[0].rows].map(r => [...r.querySelectorAll("td")].map(
                td => Number(td.dataset.value))),
        }))""",
    )
    return shapes


def api_translation(server: ServerProcess, text: str) -> dict[str, Any]:
    response = httpx.post(
        f"{server.url}/v1/translate",
        json={"text": text, "beam_size": 4, "n_best": 2, "alignments": True},
        timeout=30,
    )
    response.raise_for_status()
    result: dict[str, Any] = response.json()["translations"][0]
    return result


def assert_heatmaps_match(page: Page, server: ServerProcess, text: str) -> list[tuple[int, int]]:
    """One heatmap per sentence, each target × source tokens of that sentence, with its weights."""
    sentences = api_translation(server, text)["sentences"]
    expect(page.locator(".heatmap")).to_have_count(len(sentences))
    shapes = heatmap_shapes(page)
    for shape, sentence in zip(shapes, sentences, strict=True):
        best = sentence["hypotheses"][0]
        n_target, n_source = len(best["tokens"]), len(sentence["source_tokens"])
        assert n_source == len(sentence["source"].split())  # the small engine: one token per word
        assert (shape["rows"], shape["cols"]) == (n_target, n_source)
        assert shape["cellsPerRow"] == [n_source] * n_target
        assert shape["targetLabels"] == best["tokens"]
        assert shape["sourceLabels"] == sentence["source_tokens"]
        assert shape["weights"] == best["alignment"]
    return [(s["rows"], s["cols"]) for s in shapes]


def test_a_paragraph_shows_one_heatmap_per_sentence_and_follows_the_input(
    page: Page, server: ServerProcess, screenshots: Path
) -> None:
    open_playground(page, server)
    translate(page, PARAGRAPH)
    first = assert_heatmaps_match(page, server, PARAGRAPH)
    assert first == [(9, 9), (3, 3), (14, 14)]
    # "Two dogs play." reversed: its first output word looks at the last source word.
    page.locator(".heatmap").nth(1).locator("tbody tr").first.locator("td").last.hover()
    expect(page.locator(".readout").nth(1)).to_have_text("PLAY. ← play.: 1.000")
    timings = page.locator("#translate-timings")
    for stage in ("body", "segment", "translate", "total", "browser"):
        expect(timings.locator(f'[data-stage="{stage}"]')).to_contain_text(" ms")
    page.screenshot(path=screenshots / "translate-paragraph.png", full_page=True)

    translate(page, OTHER_PARAGRAPH)
    expect(page.locator(".sentence .source").first).to_have_text("Birds fly south in winter.")
    second = assert_heatmaps_match(page, server, OTHER_PARAGRAPH)
    assert second == [(5, 5), (9, 9)] != first
    page.screenshot(path=screenshots / "translate-other.png", full_page=True)


def test_the_n_best_list_shows_each_hypothesis_with_its_score(page: Page, server: ServerProcess) -> None:
    open_playground(page, server)
    translate(page, "Two dogs play. A cat sleeps.", beam_size=3, n_best=3)
    expect(page.locator(".sentence")).to_have_count(2)
    for sentence in page.locator(".sentence").all():
        items = sentence.locator(".nbest li")
        expect(items).to_have_count(3)
        scores = [float(s) for s in items.locator(".score").all_inner_texts()]
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
        texts = items.locator(".hypothesis").all_inner_texts()
        assert len(set(texts)) == 3  # three different hypotheses, not one repeated
    expect(page.locator(".sentence").first.locator(".nbest li").first).to_contain_text("PLAY. dogs Two")


def test_three_sentences_give_a_3x3_similarity_matrix_with_ones_on_the_diagonal(
    page: Page, server: ServerProcess, screenshots: Path
) -> None:
    open_playground(page, server)
    page.fill("#embed-text", "\n".join(EMBED_SENTENCES))
    page.click("#embed-button")
    matrix = page.locator("table.similarity")
    expect(matrix).to_have_attribute("data-n", "3")
    values: list[list[float]] = matrix.evaluate(
        "t => [...t.tBodies[0].rows].map("
        "r => [...r.querySelectorAll('td')].map(td => Number(td.dataset.value)))"
    )
    assert [len(row) for row in values] == [3, 3, 3]
    for i in range(3):
        assert math.isclose(values[i][i], 1.0, abs_tol=1e-3)
        for j in range(3):
            assert math.isclose(values[i][j], values[j][i], abs_tol=1e-4)
            if i != j:
                assert values[i][j] < 0.999
    expect(page.locator('#embed-timings [data-stage="embed"]')).to_contain_text(" ms")
    page.screenshot(path=screenshots / "embed-matrix.png", full_page=True)


def test_the_model_line_names_the_served_models(page: Page, server: ServerProcess) -> None:
    open_playground(page, server)
    line = page.locator("#models")
    expect(line).to_contain_text("small-translate (translate, fp32, CPU, en→de)")
    expect(line).to_contain_text("small-embed (embed, fp32, CPU, dim 8)")


def test_each_panel_says_what_its_model_was_trained_on_and_offers_examples_from_there(
    page: Page, server: ServerProcess, screenshots: Path
) -> None:
    translate_requests: list[Any] = []
    page.on(
        "request", lambda r: translate_requests.append(r.post_data_json) if "/v1/translate" in r.url else None
    )
    open_playground(page, server)
    expect(page.locator("#translate-model option")).to_have_text(["small-translate (en→de)"])
    about = page.locator("#translate-domain")
    expect(about.locator(".trained-on")).to_have_text(f"small-translate was trained on {CAPTIONS}.")
    expect(about.locator(".domain-warning")).to_contain_text("far from that domain translates poorly")
    examples = about.locator("button.example")
    expect(examples).to_have_count(4)  # English image captions: the model's source language and domain
    assert "Two dogs are playing in the snow." in examples.all_inner_texts()
    chosen = examples.nth(1).inner_text()
    examples.nth(1).click()
    expect(page.locator("#translate-text")).to_have_value(chosen)
    expect(page.locator("#translate-text")).to_be_focused()
    page.click("#translate-button")
    expect(page.locator(".sentence .source")).to_have_text([chosen])
    assert translate_requests[-1]["model"] == "small-translate"  # the model the panel describes

    embed_about = page.locator("#embed-domain")
    expect(embed_about.locator(".trained-on")).to_have_text(f"small-embed was trained on {PAIRS}.")
    pairs = embed_about.locator("button.example")
    expect(pairs).to_have_count(3)
    pairs.first.click()
    first, second = page.locator("#embed-text").input_value().split("\n")
    assert pairs.first.inner_text() == f"{first} / {second}"
    page.click("#embed-button")
    expect(page.locator("table.similarity")).to_have_attribute("data-n", "2")
    page.screenshot(path=screenshots / "trained-on-and-examples.png", full_page=True)


def test_a_model_that_does_not_say_is_said_not_to_and_gets_no_examples(
    page: Page, busy_server: ServerProcess
) -> None:
    open_playground(page, busy_server)
    about = page.locator("#translate-domain")
    expect(about.locator(".trained-on")).to_have_text(
        "small-translate's manifest does not say what it was trained on."
    )
    expect(about.locator(".domain-warning")).to_be_visible()
    expect(about.locator("button.example")).to_have_count(0)  # no domain: no examples claimed for it
    expect(page.locator("#embed-domain .trained-on")).to_contain_text("does not say")


def test_api_errors_are_shown_as_messages(page: Page, server: ServerProcess, screenshots: Path) -> None:
    open_playground(page, server)
    translate(page, "   ")
    error = page.locator("#translate-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("422")
    expect(error).to_contain_text("request id")
    page.fill("#embed-text", "\n\n")
    page.click("#embed-button")
    expect(page.locator("#embed-error")).to_contain_text("422")
    page.screenshot(path=screenshots / "errors.png", full_page=True)
    translate(page, "Two dogs play.")  # a success clears the message
    expect(page.locator(".heatmap")).to_have_count(1)
    expect(error).to_be_hidden()


def test_a_full_queue_is_shown_as_429_with_its_retry_after(
    page: Page, busy_server: ServerProcess, screenshots: Path
) -> None:
    open_playground(page, busy_server)
    texts = [f"filler {i}" for i in range(4)]  # one runs, three wait: the page's three do not fit
    filler = threading.Thread(
        target=lambda: httpx.post(f"{busy_server.url}/v1/embed", json={"texts": texts}, timeout=60)
    )
    filler.start()
    try:
        deadline = time.monotonic() + 10
        while busy_server.metric("tserve_queue_depth", model="small-embed") < 3:  # then 1 s at 3, 1 s at 2
            assert time.monotonic() < deadline, "the filler request never queued"
            time.sleep(0.05)
        page.fill("#embed-text", "\n".join(EMBED_SENTENCES))
        page.click("#embed-button")
        error = page.locator("#embed-error")
        expect(error).to_contain_text("429 queue_full")
        expect(error).to_contain_text("retry after")
        page.screenshot(path=screenshots / "queue-full-429.png", full_page=True)
    finally:
        filler.join()


def test_with_api_keys_the_page_asks_for_one_and_sends_it_as_a_bearer_token(
    page: Page, keyed_server: ServerProcess, screenshots: Path
) -> None:
    api_calls: list[Request] = []
    page.on("request", lambda r: api_calls.append(r) if "/v1/" in r.url else None)
    response = page.goto(f"{keyed_server.url}/")
    assert response is not None and response.status == 200  # the page itself needs no key
    expect(page.locator("#key-section")).to_be_visible()
    expect(page.locator("#key-message")).to_contain_text("401")
    expect(page.locator("#api-key")).to_be_focused()
    page.screenshot(path=screenshots / "api-key.png", full_page=True)

    page.fill("#api-key", "wrong-key")
    page.press("#api-key", "Enter")
    expect(page.locator("#key-message")).to_contain_text("403")

    page.fill("#api-key", API_KEY)
    page.click("#key-button")
    expect(page.locator("#models .model")).to_have_count(2)
    expect(page.locator("#key-section")).to_be_hidden()
    translate(page, "Two dogs play. A cat sleeps.")
    expect(page.locator(".heatmap")).to_have_count(2)
    authorizations = [r.headers.get("authorization") for r in api_calls]
    assert authorizations[0] is None  # before any key was given
    assert "Bearer wrong-key" in authorizations
    with_key = api_calls[authorizations.index(f"Bearer {API_KEY}") :]
    assert [r.url.removeprefix(keyed_server.url) for r in with_key] == ["/v1/models", "/v1/translate"]
    assert {r.headers.get("authorization") for r in with_key} == {f"Bearer {API_KEY}"}


def tab_to(page: Page, element_id: str, limit: int = 40) -> list[str]:
    """Press Tab until ``element_id`` has the focus; the ids passed on the way."""
    visited: list[str] = []
    for _ in range(limit):
        page.keyboard.press("Tab")
        focused = page.evaluate("document.activeElement && document.activeElement.id")
        visited.append(focused)
        if focused == element_id:
            return visited
    raise AssertionError(f"Tab never reached #{element_id}: {visited}")


def test_keyboard_alone_reaches_and_triggers_every_control(page: Page, server: ServerProcess) -> None:
    open_playground(page, server)
    visited = tab_to(page, "translate-button")
    assert [i for i in visited if i] == [
        "translate-model",
        "translate-text",
        "beam-size",
        "n-best",
        "translate-button",
    ]
    page.keyboard.press("Enter")
    expect(page.locator(".heatmap")).to_have_count(3)  # the default text: three sentences

    # Next in the tab order: the first map; the arrow keys move a cursor over its cells.
    page.keyboard.press("Tab")
    first_map = page.locator(".heatmap-scroll").first
    expect(first_map).to_be_focused()
    for key in ("ArrowRight", "ArrowDown", "ArrowRight"):  # the first press lands on the top left
        page.keyboard.press(key)
    cell = first_map.locator("tbody tr").nth(1).locator("td").nth(1)
    expect(cell).to_have_class("cursor")
    expect(page.locator(".readout").first).to_have_text(cell.get_attribute("title") or "no title")

    tab_to(page, "embed-text")
    page.keyboard.press("Control+Enter")
    expect(page.locator("table.similarity")).to_have_attribute("data-n", "3")

    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "embed-button"
    page.fill("#embed-text", "One line.\nAnother line.")
    page.focus("#embed-button")
    page.keyboard.press("Enter")
    expect(page.locator("table.similarity")).to_have_attribute("data-n", "2")


def test_at_400_px_nothing_overflows_the_page(page: Page, server: ServerProcess, screenshots: Path) -> None:
    page.set_viewport_size({"width": 400, "height": 900})
    open_playground(page, server)
    longest = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen."
    translate(page, f"{longest} Short one.")
    expect(page.locator(".heatmap")).to_have_count(2)
    page.fill("#embed-text", "\n".join(EMBED_SENTENCES))
    page.click("#embed-button")
    expect(page.locator("table.similarity")).to_be_visible()
    translate(page, "  ")
    expect(page.locator("#translate-error")).to_be_visible()
    widths = page.evaluate(
        "({page: document.documentElement.scrollWidth, view: document.documentElement.clientWidth})"
    )
    assert widths["page"] <= widths["view"], widths
    # What is wider than the screen (a 15-token heatmap) scrolls inside its own box.
    inside = page.locator(".heatmap-scroll").first.evaluate("e => e.getBoundingClientRect().right")
    assert inside <= widths["view"]
    page.screenshot(path=screenshots / "narrow-400px.png", full_page=True)
