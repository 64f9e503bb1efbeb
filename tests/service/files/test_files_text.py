"""The text formats through both file routes: translated where they hold text, everything else
byte for byte (checked by parsing the result, with markdown-it-py for Markdown)."""

from __future__ import annotations

import httpx
import pytest
from markdown_it import MarkdownIt

from tests.service.api.conftest import Served, serving
from tests.service.files.conftest import file_settings, translate_v1
from tests.service.files.conftest import reversed_words as r

pytestmark = pytest.mark.anyio


async def test_txt_keeps_its_lines_indentation_and_byte_order_mark(served: Served) -> None:
    source = "\ufeffTwo dogs play.\r\n\r\n    A man rides a bike. He smiles.\n- a list item\n42\n"
    response = await translate_v1(served.client, "notes.txt", source.encode())
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert 'filename="notes.txt"' in response.headers["content-disposition"]
    assert response.headers["content-language"] == "de"
    expected = (
        f"\ufeff{r('Two dogs play.')}\r\n\r\n    {r('A man rides a bike.')} {r('He smiles.')}\n"
        f"- {r('a list item')}\n42\n"
    )
    assert response.content.decode() == expected


async def test_srt_keeps_numbers_and_timings_and_joins_a_cues_lines(served: Served) -> None:
    source = (
        "1\n00:00:01,000 --> 00:00:02,500\nTwo dogs are\nplaying in the snow.\n\n"
        "2\n00:00:03,000 --> 00:00:04,000\nA woman reads.\n"
    )
    response = await translate_v1(served.client, "film.srt", source.encode())
    assert response.status_code == 200, response.text
    assert response.content.decode() == (
        f"1\n00:00:01,000 --> 00:00:02,500\n{r('Two dogs are playing in the snow.')}\n\n"
        f"2\n00:00:03,000 --> 00:00:04,000\n{r('A woman reads.')}\n"
    )


async def test_srt_without_a_timing_is_refused_as_not_subtitles(served: Served) -> None:
    response = await translate_v1(served.client, "film.srt", b"just some words\n")
    assert response.status_code == 415
    assert "SubRip" in response.json()["error"]["message"]


MARKDOWN = """# The big title

A dog runs in the park. Run `make test` to see [the docs](https://example.com/a_b "Docs") now.
The line goes on here.

> A quoted line.

- first item of the list
- second item

```python
print("Two dogs play.")
```

| name | what it is |
|------|------------|
| one dog | a small dog |
"""


def _blocks(markdown: str) -> list[tuple[str, str]]:
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    return [(t.type, t.info) for t in tokens if t.type != "inline"]


def _inline_kinds(markdown: str) -> list[tuple[str, str]]:
    """Every code span and link destination: what must come back untouched."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    kept = []
    for token in tokens:
        for child in token.children or []:
            if child.type == "code_inline":
                kept.append(("code", child.content))
            if child.type == "link_open":
                kept.append(("link", str(child.attrs["href"])))
    return kept


async def test_markdown_keeps_its_structure_code_and_urls(served: Served) -> None:
    response = await translate_v1(served.client, "README.md", MARKDOWN.encode())
    assert response.status_code == 200, response.text
    out = response.content.decode()
    assert response.headers["content-type"] == "text/markdown; charset=utf-8"
    assert _blocks(out) == _blocks(MARKDOWN)
    assert (
        _inline_kinds(out)
        == _inline_kinds(MARKDOWN)
        == [
            ("code", "make test"),
            ("link", "https://example.com/a_b"),
        ]
    )
    assert '```python\nprint("Two dogs play.")\n```' in out  # code blocks untouched
    assert f"# {r('The big title')}\n" in out
    assert f"{r('A dog runs in the park.')} {r('Run')} `make test`" in out
    assert (
        f'[{r("the docs")}](https://example.com/a_b "Docs") {r("now.")} {r("The line goes on here.")}\n'
        in out
    )
    assert f"> {r('A quoted line.')}" in out
    assert f"| {r('one dog')} | {r('a small dog')} |" in out


async def test_html_is_translated_between_its_tags(served: Served) -> None:
    source = (
        '<html><head><title>The page</title></head><body><p class="x">Two dogs play.</p>'
        "<pre>A b c.</pre></body></html>"
    )
    response = await translate_v1(served.client, "page.html", source.encode())
    assert response.status_code == 200, response.text
    assert response.content.decode() == source.replace("The page", r("The page")).replace(
        "Two dogs play.", r("Two dogs play.")
    )


async def test_libretranslate_translate_file_answers_a_download_url(served: Served) -> None:
    response = await served.client.post(
        "/translate_file",
        files={"file": ("notes.txt", b"Two dogs play.\n")},
        data={"source": "en", "target": "de"},
    )
    assert response.status_code == 200, response.text
    url = response.json()["translatedFileUrl"]
    assert url.startswith("http://test/download_file/") and url.endswith(".notes.txt")
    download = await served.client.get(httpx.URL(url).path)
    assert download.status_code == 200
    assert download.content.decode() == r("Two dogs play.") + "\n"
    assert 'filename="notes.txt"' in download.headers["content-disposition"]


async def test_libretranslate_errors_have_its_shape(served: Served) -> None:
    client = served.client
    missing = await client.post("/translate_file", files={"file": ("a.txt", b"x")}, data={"target": "de"})
    assert missing.status_code == 400 and "missing source parameter" in missing.json()["error"]
    program = await client.post(
        "/translate_file",
        files={"file": ("program.exe", b"MZ\x90\x00")},
        data={"source": "en", "target": "de"},
    )
    assert program.status_code == 415 and set(program.json()) == {"error"}
    unknown = await client.get("/download_file/0123.notes.txt")
    assert unknown.status_code == 404 and set(unknown.json()) == {"error"}
    for name in (".env", "a%5Cb"):
        traversal = await client.get(f"/download_file/{name}")
        assert traversal.status_code == 400 and traversal.json() == {"error": "Invalid filename"}


async def test_frontend_settings_advertise_the_formats(served: Served) -> None:
    settings = (await served.client.get("/frontend/settings")).json()
    assert settings["filesTranslation"] is True
    assert {".txt", ".md", ".srt", ".html"} <= set(settings["supportedFilesFormat"])


async def test_a_file_is_one_request_through_the_queue(served: Served) -> None:
    lines = [f"Dog number {i} runs." for i in range(30)]
    response = await translate_v1(served.client, "many.txt", "\n".join(lines).encode())
    assert response.status_code == 200, response.text
    assert response.content.decode().split("\n") == [r(line) for line in lines]
    sentences = [s for batch in served.translator.hooks.batches for s in batch]
    assert sorted(sentences) == sorted(lines)  # 30 texts, beyond max_items_per_request (8)


async def test_source_auto_detects_the_files_language(served: Served) -> None:
    text = "A man is riding a bicycle down the street.\nTwo dogs are playing in the snow.\n"
    response = await translate_v1(served.client, "notes.txt", text.encode(), source_language="auto")
    assert response.status_code == 200, response.text
    assert response.content.decode() == "".join(r(line) + "\n" for line in text.splitlines())


async def test_both_routes_check_the_api_key() -> None:
    async with serving(file_settings(api_keys=["secret"])) as served:
        client, file = served.client, {"file": ("a.txt", b"Two dogs play.")}
        assert (await translate_v1(client, "a.txt", b"Two dogs play.")).status_code == 401
        keyed = await client.post(
            "/v1/translate/file",
            files=file,
            data={"target_language": "de"},
            headers={"Authorization": "Bearer secret"},
        )
        assert keyed.status_code == 200
        form = {"source": "en", "target": "de"}
        wrong = await client.post("/translate_file", files=file, data={**form, "api_key": "nope"})
        assert wrong.status_code == 403 and set(wrong.json()) == {"error"}
        right = await client.post("/translate_file", files=file, data={**form, "api_key": "secret"})
        assert right.status_code == 200
