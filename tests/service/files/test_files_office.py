"""Word, PowerPoint and OpenDocument files made here come back translated, parsed again: every
paragraph's text translated into its first run, the other runs emptied, the rest unchanged."""

from __future__ import annotations

import io
import zipfile

import pytest
from lxml import etree

from tests.service.api.conftest import Served
from tests.service.files.conftest import reversed_words as r
from tests.service.files.conftest import translate_v1
from tests.service.files.documents import TEXT, A, W, docx, epub, odf, pptx

pytestmark = pytest.mark.anyio

PARAGRAPHS = [
    [("Two dogs ", False), ("play", True), (" in the snow.", False)],
    [("A woman reads a book.", False)],
    [("2024", False)],
]


def _parts(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {name: z.read(name) for name in z.namelist()}


def _runs(xml: bytes, paragraph: str, text: str) -> list[list[str]]:
    root = etree.fromstring(xml)
    return [[t.text or "" for t in p.iter(text)] for p in root.iter(paragraph)]


async def test_docx_paragraphs_are_translated_into_their_first_run(served: Served) -> None:
    source = docx(PARAGRAPHS)
    response = await translate_v1(served.client, "report.docx", source)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/vnd.openxmlformats")
    parts = _parts(response.content)
    assert list(parts) == list(_parts(source))  # the same entries in the same order
    assert _runs(parts["word/document.xml"], f"{{{W}}}p", f"{{{W}}}t") == [
        [r("Two dogs play in the snow."), "", ""],
        [r("A woman reads a book.")],
        ["2024"],
    ]
    root = etree.fromstring(parts["word/document.xml"])
    assert len(root.findall(f".//{{{W}}}b")) == 1  # the bold run is still there
    assert root.prefix == "w"  # namespace prefixes kept, as Word requires


async def test_pptx_slides_are_translated(served: Served) -> None:
    source = pptx([PARAGRAPHS[:1], PARAGRAPHS[1:]])
    response = await translate_v1(served.client, "talk.pptx", source)
    assert response.status_code == 200, response.text
    parts = _parts(response.content)
    assert _runs(parts["ppt/slides/slide1.xml"], f"{{{A}}}p", f"{{{A}}}t") == [
        [r("Two dogs play in the snow."), "", ""]
    ]
    assert _runs(parts["ppt/slides/slide2.xml"], f"{{{A}}}p", f"{{{A}}}t") == [
        [r("A woman reads a book.")],
        ["2024"],
    ]


@pytest.mark.parametrize("extension", [".odt", ".odp"])
async def test_opendocument_paragraphs_are_translated(served: Served, extension: str) -> None:
    source = odf(PARAGRAPHS, presentation=extension == ".odp")
    response = await translate_v1(served.client, f"letter{extension}", source)
    assert response.status_code == 200, response.text
    parts = _parts(response.content)
    with zipfile.ZipFile(io.BytesIO(response.content)) as z:
        first = z.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
    root = etree.fromstring(parts["content.xml"])
    paragraphs = list(root.iter(f"{{{TEXT}}}p"))
    assert ["".join(p.itertext()) for p in paragraphs] == [
        r("Two dogs play in the snow."),
        r("A woman reads a book."),
        "2024",
    ]
    assert paragraphs[0].text == r("Two dogs play in the snow.")
    assert len(paragraphs[0].findall(f"{{{TEXT}}}span")) == 1  # the span stays, emptied


async def test_an_archive_of_another_kind_is_refused(served: Served) -> None:
    response = await translate_v1(served.client, "report.docx", odf(PARAGRAPHS))
    assert response.status_code == 415
    assert "not a Word document" in response.json()["error"]["message"]


async def test_epub_chapters_are_translated_as_xhtml(served: Served) -> None:
    source = epub(
        ["<h1>The first day</h1><p>Two dogs play. <em>A man</em> waves.</p>", "<p>A cat sleeps.</p>"]
    )
    response = await translate_v1(served.client, "book.epub", source)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/epub+zip"
    parts = _parts(response.content)
    assert list(parts) == list(_parts(source))
    with zipfile.ZipFile(io.BytesIO(response.content)) as z:
        first = z.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
    chapter = etree.fromstring(parts["OEBPS/chapter1.xhtml"])
    xhtml = "{http://www.w3.org/1999/xhtml}"
    assert chapter.findtext(f".//{xhtml}title") == r("Chapter 1")
    assert chapter.findtext(f".//{xhtml}h1") == r("The first day")
    paragraph = chapter.find(f".//{xhtml}p")
    assert paragraph is not None
    # one text, the emphasis on the words aligned to its own (the toy aligns reversed words)
    assert paragraph.text == r("Two dogs play.") + " WAVES. "
    assert paragraph.findtext(f"{xhtml}em") == "man A"
    assert etree.fromstring(parts["OEBPS/chapter2.xhtml"]).findtext(f".//{xhtml}p") == r("A cat sleeps.")
    assert parts["OEBPS/content.opf"] == _parts(source)["OEBPS/content.opf"]
