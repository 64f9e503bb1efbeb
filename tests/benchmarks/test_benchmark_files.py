"""Stage ``files``: the Markdown and .docx files it builds hold exactly the document's sentences
for the service's own readers (the code block kept out), and its rows set each file against the
document text, the best turn of each, a failing system noted once while the others are measured."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from benchmarks.documents import as_document
from benchmarks.files import CODE_BLOCK, SECTION, docx_file, file_rows, markdown_file
from benchmarks.results import Results
from service.files.registry import file_format, zip_limits
from service.settings import Settings

SENTENCES = [f"A dog number {i} runs & jumps." for i in range(12)]


def texts_read(name: str, data: bytes) -> list[str]:
    """The texts the service would translate in the file, each whitespace run one space."""
    extracted = file_format(name).read(data, zip_limits(Settings()), False)
    return [" ".join(t.split()) for t in extracted.texts if t.strip()]


def test_the_files_hold_the_documents_paragraphs_for_the_services_readers() -> None:
    paragraphs = as_document(SENTENCES).split("\n\n")
    assert texts_read("captions.docx", docx_file(SENTENCES)) == paragraphs
    assert texts_read("captions.md", markdown_file(SENTENCES)) == paragraphs
    assert CODE_BLOCK in markdown_file(SENTENCES).decode()


class Service:
    """Answers on a clock of the test's own: each system's turns take the seconds given, in turn."""

    def __init__(self, seconds: dict[str, list[float]], failing: str | None = None) -> None:
        self.seconds, self.failing, self.now = seconds, failing, 0.0
        self.sent: list[tuple[str, str]] = []

    def _answer(self, what: str) -> bytes:
        self.sent.append(("x", what))
        if what == self.failing:
            raise httpx.ConnectError("refused")
        self.now += self.seconds[what].pop(0)
        return b"ok"

    def post_json(self, url: str, body: dict[str, Any]) -> bytes:
        assert url == "http://x/v1/translate"
        assert body == {"text": as_document(SENTENCES), "target_language": "de"}
        return self._answer("text")

    def post_file(self, url: str, name: str, data: bytes) -> bytes:
        assert url == "http://x/v1/translate/file"
        assert data == {"captions.md": markdown_file, "captions.docx": docx_file}[name](SENTENCES)
        return self._answer(name)

    def clock(self) -> float:
        return self.now


def test_each_file_is_set_against_the_document_text_at_its_best_turn() -> None:
    service = Service({"text": [2.0, 1.2], "captions.md": [1.5, 1.6], "captions.docx": [3.0, 2.4]})
    results = Results()
    file_rows(results, "http://x", SENTENCES, 2, service.post_json, service.post_file, service.clock)
    assert [r.section for r in results.rows] == [SECTION.format(n=12)] * 3
    text, md, docx = results.rows
    assert text.baseline and not md.baseline and not docx.baseline
    assert (text.value, md.value, docx.value) == pytest.approx((10.0, 8.0, 5.0))
    assert (md.ratio, docx.ratio) == pytest.approx((0.8, 0.5))
    assert docx.extra == {"latency_ms": pytest.approx(2400.0), "upload_bytes": len(docx_file(SENTENCES))}
    assert [what for _, what in service.sent] == ["text", "captions.md", "captions.docx"] * 2  # in turn
    assert results.notes == []


def test_a_failing_system_is_noted_once_and_the_others_measured() -> None:
    service = Service({"text": [1.0, 1.0], "captions.md": [1.0, 1.0]}, failing="captions.docx")
    results = Results()
    file_rows(results, "http://x", SENTENCES, 2, service.post_json, service.post_file, service.clock)
    assert [r.system for r in results.rows] == [
        "one document text, POST /v1/translate",
        ".md file, POST /v1/translate/file",
    ]
    assert len(results.notes) == 1 and ".docx file" in results.notes[0] and "ConnectError" in results.notes[0]
