"""A paragraph's runs and an HTML file's inline elements placed on the translation by the
alignment, with a translator whose alignment the test controls (the small one reverses words, so
the order a placement keeps would squeeze its elements out)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import AsyncIterator

import pytest
from lxml import etree

from service.engine.base import TranslateItem, Translation, TranslationHypothesis
from service.files.office import MAX_RUNS
from tests.service.api.conftest import Served, serving
from tests.service.files.conftest import file_settings, translate_v1
from tests.service.files.documents import W, docx, odf
from tests.service.small_engines import HashEmbedder, ReverseTranslator

pytestmark = pytest.mark.anyio

SOURCE = "Two dogs play in the deep snow."
# each target word's source word (the toy's tokens are the words): "the" aligns to nothing
TABLE = {SOURCE: (["Zwei", "Hunde", "spielen", "im", "tiefen", "Schnee."], [0, 1, 2, 3, 5, 6])}
RUNS = ["Two dogs ", "play", " in the ", "deep snow", "."]


class TableTranslator(ReverseTranslator):
    """The table's sentences word for word with their alignment; any other reversed."""

    def _translate(self, source: list[str], item: TranslateItem) -> Translation:
        found = TABLE.get(" ".join(source))
        if found is None:
            return super()._translate(source, item)
        tokens, links = found
        alignment = None
        if item.options.alignments:
            alignment = [[1.0 if s == link else 0.0 for s in range(len(source))] for link in links]
        hypothesis = TranslationHypothesis(" ".join(tokens), -0.1, tokens, alignment)
        return Translation([hypothesis], source, len(source) + 1, len(tokens) + 1)


def _translator(alignments: bool = True) -> TableTranslator:
    translator = TableTranslator(name=f"table-{alignments}", max_len=64)
    info = translator.manifest.translation
    assert info is not None
    translation = info.model_copy(update={"has_alignments": alignments})
    translator.manifest = translator.manifest.model_copy(update={"translation": translation})
    return translator


@pytest.fixture
async def table() -> AsyncIterator[Served]:
    async with serving(file_settings(), {"embed": HashEmbedder(), "translate": _translator()}) as s:
        yield s


def _run(text: str, properties: str = "") -> str:
    return f"<w:r>{properties}<w:t xml:space='preserve'>{text}</w:t></w:r>"


FIELD = (
    "<w:r><w:fldChar w:fldCharType='begin'/></w:r><w:r><w:instrText>PAGE</w:instrText></w:r>"
    "<w:r><w:fldChar w:fldCharType='end'/></w:r>"
)
PARAGRAPH = (
    "<w:p>"
    + _run(RUNS[0])
    + _run(RUNS[1], "<w:rPr><w:b/></w:rPr>")
    + _run(RUNS[2])
    + _run(RUNS[3], "<w:rPr><w:i/></w:rPr>")
    + _run(RUNS[4])
    + "<w:r><w:br/></w:r><w:r><w:footnoteReference w:id='1'/></w:r>"
    + FIELD
    + "</w:p>"
)


def _document(body: str) -> bytes:
    head = f"<?xml version='1.0' encoding='UTF-8'?><w:document xmlns:w='{W}'>"
    return f"{head}<w:body>{body}</w:body></w:document>".encode()


def _paragraph(data: bytes) -> etree._Element:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        paragraph = etree.fromstring(z.read("word/document.xml")).find(f".//{{{W}}}p")
    assert paragraph is not None
    return paragraph


def _texts(paragraph: etree._Element) -> list[str]:
    return [t.text or "" for t in paragraph.iter(f"{{{W}}}t")]


async def test_a_bold_word_and_an_italic_phrase_keep_their_formatting(table: Served) -> None:
    response = await translate_v1(table.client, "report.docx", docx([], _document(PARAGRAPH)))
    assert response.status_code == 200, response.text
    paragraph = _paragraph(response.content)
    texts = _texts(paragraph)
    assert "".join(texts) == "Zwei Hunde spielen im tiefen Schnee."
    runs = paragraph.findall(f"{{{W}}}r")
    bold = next(r for r in runs if r.find(f".//{{{W}}}b") is not None)
    italic = next(r for r in runs if r.find(f".//{{{W}}}i") is not None)
    assert bold.findtext(f"{{{W}}}t") == "spielen"
    assert (italic.findtext(f"{{{W}}}t") or "").strip() == "tiefen Schnee"
    # the break, the footnote reference and the field after the text, in their order
    tags = [
        etree.QName(child).localname for r in runs for child in r if etree.QName(child).localname != "rPr"
    ]
    assert tags == ["t"] * 5 + ["br", "footnoteReference", "fldChar", "instrText", "fldChar"]


async def test_an_opendocument_span_keeps_its_words(table: Served) -> None:
    source = odf([[("Two dogs ", False), ("play", True), (" in the deep snow.", False)]])
    response = await translate_v1(table.client, "letter.odt", source)
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as z:
        content = etree.fromstring(z.read("content.xml"))
    text = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
    paragraph = content.find(f".//{text}p")
    assert paragraph is not None
    assert "".join(paragraph.itertext()) == "Zwei Hunde spielen im tiefen Schnee."
    assert paragraph.findtext(f"{text}span") == "spielen"


async def test_an_html_file_places_its_inline_elements(table: Served) -> None:
    html = b"<p>Two dogs play in the <b class=x>deep snow</b>.</p>"
    response = await translate_v1(table.client, "page.html", html)
    assert response.status_code == 200, response.text
    assert response.text == "<p>Zwei Hunde spielen im <b class=x>tiefen Schnee</b>.</p>"


async def test_a_model_without_alignments_keeps_the_first_run_rule() -> None:
    given = {"embed": HashEmbedder(), "translate": _translator(alignments=False)}
    async with serving(file_settings(), given) as served:
        response = await translate_v1(served.client, "report.docx", docx([], _document(PARAGRAPH)))
        assert response.status_code == 200, response.text
        assert _texts(_paragraph(response.content)) == [
            "Zwei Hunde spielen im tiefen Schnee.",
            "",
            "",
            "",
            "",
        ]
        html = b"<p>Two dogs play in the <b>deep snow</b>.</p>"
        response = await translate_v1(served.client, "page.html", html)
        assert response.text.startswith("<p>") and "<b>" in response.text  # each text node alone


@pytest.mark.parametrize("runs", [MAX_RUNS, 3 * MAX_RUNS])
async def test_thousands_of_runs_lose_no_text(runs: int) -> None:
    """Up to ``MAX_RUNS`` runs are placed, more get the first run rule; no word is lost."""
    body = "".join(_run("dog ", "<w:rPr><w:b/></w:rPr>" if i % 2 else "") for i in range(runs))
    given = {"embed": HashEmbedder(), "translate": _translator()}
    async with serving(file_settings(max_archive_ratio=10_000), given) as served:
        response = await translate_v1(served.client, "r.docx", docx([], _document(f"<w:p>{body}</w:p>")))
    assert response.status_code == 200, response.text
    texts = _texts(_paragraph(response.content))
    assert len(texts) == runs
    assert "".join(texts).lower().split() == ["dog"] * runs
    assert any(texts[1:]) == (runs <= MAX_RUNS)
