"""Stage ``files``: file translation against the same text sent as one document.

The first 200 Multi30k test sentences in paragraphs of five (``documents.as_document``'s layout)
go to our service three ways: as one document text to ``POST /v1/translate``, and as a Markdown
file and a .docx file (each paragraph's first sentence in a bold run), both built here, to
``POST /v1/translate/file``. All three are the same sentences through the same queue at the
same beam (4, both routes' default); a file adds its upload, its parsing into texts and its
rebuilding around the translations. Sentences/s of each (the best of ``--rounds`` turns, the
systems in turn) and its latency. The benchmark's service has no translation cache
(``benchmarks/common.py``), so every turn decodes every sentence.
"""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Callable, Sequence
from typing import Any
from xml.sax.saxutils import escape

import httpx

from benchmarks.documents import as_document
from benchmarks.harness import Bench, Need, Stage
from benchmarks.results import Results, Row

SECTION = "serving: {n} sentences, beam 4, no translation cache: one document text vs the same text as a file"
WORD_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
# Markdown that is kept as it is: it must come back untouched and adds no sentence
CODE_BLOCK = "```sh\ncurl -F file=@captions.md http://localhost:8000/v1/translate/file\n```"

PostJson = Callable[[str, dict[str, Any]], bytes]  # (url, JSON body) → the response's body
PostFile = Callable[[str, str, bytes], bytes]  # (url, file name, file) → the response's body


def paragraphs(sentences: Sequence[str]) -> list[str]:
    return as_document(sentences).split("\n\n")


def markdown_file(sentences: Sequence[str]) -> bytes:
    """The paragraphs as Markdown, a code block after the first."""
    parts = paragraphs(sentences)
    return "\n\n".join([parts[0], CODE_BLOCK, *parts[1:]]).encode() + b"\n"


def docx_file(sentences: Sequence[str]) -> bytes:
    """A minimal WordprocessingML document (the parts a reader needs): one paragraph per
    paragraph, its first sentence a bold run, the others one plain run."""
    body = ""
    for paragraph in paragraphs(sentences):
        first, _, rest = paragraph.partition(". ")
        runs = [(f"{first}. " if rest else first, True), *([(rest, False)] if rest else [])]
        body += "<w:p>" + "".join(_run(text, bold) for text, bold in runs) + "</w:p>"
    document = (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes'?>"
        f"<w:document xmlns:w='{WORD_NS}'><w:body>{body}</w:body></w:document>"
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, part in (
            ("[Content_Types].xml", "<?xml version='1.0'?><Types/>"),
            ("word/document.xml", document),
        ):
            # a fixed date: the same sentences make the same file, run after run
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(entry, part, zipfile.ZIP_DEFLATED)
    return out.getvalue()


def _run(text: str, bold: bool) -> str:
    style = "<w:rPr><w:b/></w:rPr>" if bold else ""
    return f"<w:r>{style}<w:t xml:space='preserve'>{escape(text)}</w:t></w:r>"


def _post_json(url: str, body: dict[str, Any]) -> bytes:
    response = httpx.post(url, json=body, timeout=600)
    response.raise_for_status()
    return response.content


def _post_file(url: str, name: str, data: bytes) -> bytes:
    response = httpx.post(url, files={"file": (name, data)}, data={"target_language": "de"}, timeout=600)
    response.raise_for_status()
    return response.content


def file_rows(
    results: Results,
    base_url: str,
    sentences: Sequence[str],
    rounds: int,
    post_json: PostJson = _post_json,
    post_file: PostFile = _post_file,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Sentences/s of the document text (the baseline) and of each file, each its best turn; a
    system whose request fails is noted and the others measured."""
    document = {"text": as_document(sentences), "target_language": "de"}
    md, docx = markdown_file(sentences), docx_file(sentences)
    sends: dict[str, tuple[Callable[[], bytes], int]] = {
        "one document text, POST /v1/translate": (
            lambda: post_json(f"{base_url}/v1/translate", document),
            len(document["text"].encode()),
        ),
        ".md file, POST /v1/translate/file": (
            lambda: post_file(f"{base_url}/v1/translate/file", "captions.md", md),
            len(md),
        ),
        ".docx file, POST /v1/translate/file": (
            lambda: post_file(f"{base_url}/v1/translate/file", "captions.docx", docx),
            len(docx),
        ),
    }
    section = SECTION.format(n=len(sentences))
    best: dict[str, float] = {}
    failed: set[str] = set()
    for _ in range(rounds):
        for system, (send, _size) in sends.items():
            if system in failed:
                continue
            start = clock()
            try:
                send()
            except httpx.HTTPError as e:
                failed.add(system)
                results.note(f"{section}: {system}: {type(e).__name__}: {str(e)[:300]}")
                continue
            best[system] = min(best.get(system, float("inf")), clock() - start)
    for i, (system, (_send, size)) in enumerate(sends.items()):
        if system in best and system not in failed:
            extra = {"latency_ms": best[system] * 1000, "upload_bytes": size}
            rate = len(sentences) / best[system]
            results.add(Row(section, system, rate, "sent/s", baseline=i == 0, extra=extra))


def run(bench: Bench) -> None:
    if bench.service is None or "small/int8" not in bench.models:
        return
    print("== file translation", flush=True)
    file_rows(bench.results, bench.service.base, bench.test_set(200)[0], bench.rounds)


STAGE = Stage("files", "file translation", frozenset({Need.OUR_CHECKPOINT, Need.SERVICE}), run)
