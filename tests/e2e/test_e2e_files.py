"""Files made here, translated by the real default model over real HTTP (multipart, as
LibreTranslate's clients post them), come back in their format with their structure intact."""

from __future__ import annotations

import io
import zipfile

import httpx
import pytest
from lxml import etree

from tests.servers import ServerProcess
from tests.service.files.documents import W, docx, epub

pytestmark = pytest.mark.slow

SUBTITLES = (
    "1\n00:00:01,000 --> 00:00:03,000\nTwo dogs are playing\nin the snow.\n\n"
    "2\n00:00:04,000 --> 00:00:06,500\nA man is riding a bicycle.\n"
)


def test_libretranslate_translate_file_and_download(service: ServerProcess) -> None:
    with httpx.Client(base_url=service.url, timeout=120) as client:
        response = client.post(
            "/translate_file",
            files={"file": ("film.srt", SUBTITLES.encode())},
            data={"source": "en", "target": "de"},
        )
        assert response.status_code == 200, response.text
        download = client.get(httpx.URL(response.json()["translatedFileUrl"]).path)
    assert download.status_code == 200
    lines = download.text.split("\n")
    assert lines[:2] == ["1", "00:00:01,000 --> 00:00:03,000"]
    assert lines[4:6] == ["2", "00:00:04,000 --> 00:00:06,500"]
    assert "hund" in lines[2].lower() and "schnee" in lines[2].lower()
    assert "mann" in lines[6].lower()


def test_v1_translates_a_word_document_and_a_book(service: ServerProcess) -> None:
    document = docx([[("A man is ", False), ("riding", True), (" a bicycle.", False)]])
    book = epub(["<p>Two dogs are playing in the snow.</p>"])
    with httpx.Client(base_url=service.url, timeout=120) as client:
        translated = [
            client.post(
                "/v1/translate/file",
                files={"file": (name, data)},
                data={"source_language": "en", "target_language": "de"},
            )
            for name, data in (("letter.docx", document), ("book.epub", book))
        ]
    assert [r.status_code for r in translated] == [200, 200], [r.text for r in translated]
    with zipfile.ZipFile(io.BytesIO(translated[0].content)) as z:
        root = etree.fromstring(z.read("word/document.xml"))
    texts = [t.text or "" for t in root.iter(f"{{{W}}}t")]
    # each run holds the words aligned to its own: the bold verb's translation stays bold
    assert len(texts) == 3 and "mann" in texts[0].lower() and texts[1].strip() == "fährt"
    with zipfile.ZipFile(io.BytesIO(translated[1].content)) as z:
        chapter = etree.fromstring(z.read("OEBPS/chapter1.xhtml"))
    paragraph = chapter.findtext(".//{http://www.w3.org/1999/xhtml}p") or ""
    assert "hund" in paragraph.lower()
