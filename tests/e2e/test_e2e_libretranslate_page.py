"""LibreTranslate's own web page against the service with API keys on, in a real browser (Debian's
chromium): it loads, lists the languages, translates text and a file once the key is entered,
and every error it meets shows as text, never ``[object Object]``.

The page is LibreTranslate's release's own (its wheel's ``templates/`` and ``static/``, which
.ci/install-tools.sh downloads, never installs), rendered as its Flask app renders it for a
server with keys. The browser takes it from the service's origin (intercepted under ``PAGE``, so
no second server), which is where the page sends its requests: ``/frontend/settings``,
``/languages``, ``/translate`` and ``/translate_file``, all served by the service itself.
"""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import httpx
import pytest

from tests.servers import ServerProcess, server_process, small_server_command

# LibreTranslate's wheel, where .ci/install-tools.sh puts it: it pins the release whose element
# ids are the selectors below
WHEELS = Path(sys.prefix) / "share" / "libretranslate-page"
PAGE = "/libretranslate-page/"
KEY = "page-key"
CHAR_LIMIT = 200
REQUEST_TIMEOUT_S = 30  # the test's own requests, on a machine as loaded as CI's

SOURCE = 'select[aria-labelledby="sourceLangLabel"] option'
TARGET = 'select[aria-labelledby="targetLangLabel"] option'
ERROR = "main .card-content p"  # the page's error card: [[ error ]]


def page_files(wheel: Path, settings: dict[str, Any]) -> dict[str, tuple[bytes, str]]:
    """Path → (body, content type) of the page, its script and its static files, the templates
    rendered with what LibreTranslate's ``index`` and ``appjs`` views give them for ``settings``."""
    import jinja2
    from markupsafe import Markup, escape

    def gettext(text: str, **variables: Any) -> str:
        return text % variables if variables else text

    def url_for(endpoint: str, filename: str = "") -> str:
        return f"{PAGE}static/{filename}" if endpoint == "static" else PAGE

    files: dict[str, tuple[bytes, str]] = {}
    templates: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("libretranslate/templates/"):
                templates[name.rsplit("/", 1)[1]] = archive.read(name).decode()
            elif name.startswith("libretranslate/static/"):
                path = PAGE + name.removeprefix("libretranslate/")
                files[path] = (archive.read(name), _content_type(name))
    environment = jinja2.Environment(
        loader=jinja2.DictLoader(templates), autoescape=jinja2.select_autoescape(["html"])
    )
    environment.globals.update(
        _=gettext,
        _e=lambda text, **variables: json.dumps(gettext(text, **variables)),
        _h=lambda text, **variables: Markup(escape(gettext(text, **variables))),
        url_for=url_for,
    )
    index = environment.get_template("index.html").render(
        frontendTimeout=settings["frontendTimeout"],
        api_keys=settings["apiKeys"],
        get_api_key_link="",
        web_version=False,
        version=wheel.name.split("-")[1],
        swagger_url="/docs",
        available_locales=[{"code": "en", "name": "English"}],
        current_locale="en",
        alternate_locales=[],
        under_attack=False,
        hide_api=False,
        frontend_title="",
    )
    script = environment.get_template("app.js.template").render(
        url_prefix="", get_api_key_link="", api_secret="", bogus_api_secret="", under_attack=False
    )
    files[PAGE] = (index.encode(), "text/html; charset=utf-8")
    files[f"{PAGE}js/app.js"] = (script.encode(), "application/javascript; charset=utf-8")
    return files


def _content_type(name: str) -> str:
    kinds = {".css": "text/css", ".js": "application/javascript", ".svg": "image/svg+xml"}
    return next((kind for suffix, kind in kinds.items() if name.endswith(suffix)), "application/octet-stream")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {
        "TSERVE_API_KEYS": json.dumps([KEY]),
        "TSERVE_MAX_TRANSLATE_CHARS_PER_REQUEST": str(CHAR_LIMIT),
        "TSERVE_MAX_WAIT_MS": "1",
    }
    log = tmp_path_factory.mktemp("libretranslate-page") / "server.log"
    with server_process(small_server_command(), env, log) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/install-tools.sh installs it with apt-get)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, server: ServerProcess) -> Iterator[Any]:
    """A fresh browser context (no key stored) whose requests under ``PAGE`` get the page's files."""
    wheels = sorted(WHEELS.glob("libretranslate-*.whl"))
    if not wheels:
        pytest.skip(f"LibreTranslate's wheel is not in {WHEELS} (.ci/install-tools.sh downloads it)")
    settings = httpx.get(f"{server.url}/frontend/settings", timeout=REQUEST_TIMEOUT_S).json()
    files = page_files(wheels[0], settings)

    def serve_page(route: Any) -> None:
        found = files.get(urlparse(route.request.url).path)
        if found is None:
            route.fulfill(status=404, body="")
        else:
            route.fulfill(status=200, body=found[0], content_type=found[1])

    context = browser.new_context(accept_downloads=True)
    opened = context.new_page()
    opened.route(f"{server.url}{PAGE}**", serve_page)
    yield opened
    context.close()


def enter_key(page: Any, key: str) -> None:
    """As a user does: the key icon, then the prompt LibreTranslate's page opens."""
    page.once("dialog", lambda dialog: dialog.accept(key))
    page.locator('#nav a[href="javascript:setApiKey()"]').click()


def shows_error(page: Any, expected: str) -> None:
    from playwright.sync_api import expect

    expect(page.locator(ERROR)).to_contain_text(expected)
    assert "[object Object]" not in page.locator(ERROR).inner_text()
    page.get_by_text("Dismiss").click()


def translated_by_the_api(server: ServerProcess, text: str) -> str:
    body = {"q": text, "source": "en", "target": "de", "api_key": KEY}
    answer = httpx.post(f"{server.url}/translate", json=body, timeout=REQUEST_TIMEOUT_S)
    translated: str = answer.json()["translatedText"]
    return translated


def test_the_page_loads_lists_the_languages_and_translates_once_the_key_is_entered(
    page: Any, server: ServerProcess
) -> None:
    from playwright.sync_api import expect

    with page.expect_response(lambda r: r.url.endswith("/frontend/settings")) as settings:
        page.goto(f"{server.url}{PAGE}")
    assert settings.value.status == 200 and settings.value.json()["keyRequired"] is True
    expect(page.locator(SOURCE)).to_have_text(["Auto Detect", "English", "German"])
    expect(page.locator(TARGET)).to_have_text(["German"])

    page.fill("#textarea1", "a small cat")  # no key yet
    shows_error(page, "API key")
    enter_key(page, "not-the-key")
    page.fill("#textarea1", "a small cat sleeps")
    shows_error(page, "Invalid API key")
    enter_key(page, KEY)
    page.fill("#textarea1", "a small cat sleeps on the mat")
    expect(page.locator("#textarea2")).to_have_value(
        translated_by_the_api(server, "a small cat sleeps on the mat")
    )


def test_a_text_over_the_limit_shows_the_limit(page: Any, server: ServerProcess) -> None:
    """The page caps what is typed at ``charLimit``; a text given in its address is sent whole."""
    page.goto(f"{server.url}{PAGE}")
    enter_key(page, KEY)
    text = "word " * (CHAR_LIMIT // 5 + 1)
    page.goto(f"{server.url}{PAGE}?source=en&target=de&q={quote(text)}")
    shows_error(page, str(CHAR_LIMIT))


@pytest.mark.parametrize(
    "rewrite, expected",
    [
        (lambda url: {"method": "GET"}, "Method Not Allowed"),
        (lambda url: {"url": url + "/v2"}, "Not Found"),
    ],
    ids=["another-method", "a-path-not-served"],
)
def test_an_unknown_method_or_path_shows_as_text(
    page: Any, server: ServerProcess, rewrite: Callable[[str], dict[str, str]], expected: str
) -> None:
    """What another release of the page might call: its /translate sent as another method, or to
    a path of LibreTranslate's API this service does not serve."""
    page.goto(f"{server.url}{PAGE}")
    enter_key(page, KEY)
    page.route(f"{server.url}/translate", lambda route: route.continue_(**rewrite(route.request.url)))
    page.fill("#textarea1", "two dogs")
    shows_error(page, expected)


def test_a_file_is_translated_and_a_refused_one_shows_why(
    page: Any, server: ServerProcess, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page.goto(f"{server.url}{PAGE}")
    enter_key(page, KEY)
    page.get_by_text("Translate Files").click()
    refused = tmp_path / "notes.xyz"
    refused.write_text("two dogs")
    page.set_input_files('input[type="file"]', str(refused))
    page.get_by_role("button", name="Translate", exact=True).click()
    shows_error(page, ".xyz")
    page.get_by_text("Translate Files").click()
    document = tmp_path / "notes.txt"
    document.write_text("two dogs run")
    page.set_input_files('input[type="file"]', str(document))
    with page.expect_download() as download:
        page.get_by_role("button", name="Translate", exact=True).click()
    saved = tmp_path / "saved.txt"
    download.value.save_as(saved)
    assert saved.read_text() == translated_by_the_api(server, "two dogs run")
    expect(page.locator(ERROR)).to_have_count(0)
