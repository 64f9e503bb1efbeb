"""The text formats: plain text, Markdown, SubRip subtitles and HTML, all UTF-8.

Their bytes must decode as UTF-8 (a byte order mark is kept) without NUL bytes: anything else is
not the text its extension says (415).

* ``.txt``: every line's text, its line breaks and indentation kept.
* ``.srt``: cue numbers, timings and blank lines kept byte for byte; a cue's text lines are
  translated together as one text and written as one line (a subtitle's line breaks are layout,
  and a sentence is often cut across them).
* ``.md``: ``service/files/markdown.py``.
* ``.html``: ``service/files/html_pieces.py``, as ``"format": "html"`` translates it: the
  markup copied byte for byte, the text runs and the readable attributes translated, inline
  elements placed by the alignment.
"""

from __future__ import annotations

import codecs
import re

from service.files.html_pieces import HtmlPieces
from service.files.markdown import markdown_pieces
from service.files.pieces import Extracted, Pieces
from service.files.refusals import InvalidFile, UnsupportedFile
from service.text.html import HtmlError, parse_html

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_TIMING = re.compile(r"\s*\d+:\d{2}:\d{2}[,.]\d{1,3}\s*-->\s*\d+:\d{2}:\d{2}[,.]\d{1,3}[^\r\n]*")
_CUE_NUMBER = re.compile(r"\s*\d+\s*")


def _decode(data: bytes, kind: str) -> tuple[str, bytes]:
    """The text and its byte order mark (or b"")."""
    bom = codecs.BOM_UTF8 if data.startswith(codecs.BOM_UTF8) else b""
    if b"\x00" in data:
        raise UnsupportedFile(f"the file is not {kind}: it holds NUL bytes")
    try:
        return data[len(bom) :].decode("utf-8"), bom
    except UnicodeDecodeError as e:
        raise UnsupportedFile(f"the file is not {kind}: not UTF-8 at byte {e.start + len(bom)}") from e


def _from_pieces(pieces: Pieces, bom: bytes) -> Extracted:
    return Extracted(pieces.texts, lambda translations, _: bom + pieces.render(translations).encode())


def read_txt(data: bytes) -> Extracted:
    text, bom = _decode(data, "plain text")
    pieces = Pieces()
    for line in _LINE.findall(text):
        body = line.rstrip("\r\n")
        pieces.add_text(body)
        pieces.add_markup(line[len(body) :])
    return _from_pieces(pieces, bom)


def read_markdown(data: bytes) -> Extracted:
    text, bom = _decode(data, "Markdown text")
    return _from_pieces(markdown_pieces(text), bom)


def read_srt(data: bytes) -> Extracted:
    text, bom = _decode(data, "SubRip subtitles")
    pieces = Pieces()
    cue_text = ""  # the current cue's text lines, gathered until a line that is not text

    def end_cue_text() -> None:
        nonlocal cue_text
        body = cue_text.rstrip("\r\n")
        pieces.add_text(body)
        pieces.add_markup(cue_text[len(body) :])
        cue_text = ""

    timings = 0
    for line in _LINE.findall(text):
        body = line.rstrip("\r\n")
        if _TIMING.fullmatch(body):
            timings += 1
        is_text = bool(body.strip()) and not _TIMING.fullmatch(body) and not _CUE_NUMBER.fullmatch(body)
        if is_text:
            cue_text += line
            continue
        end_cue_text()
        pieces.add_markup(line)
    end_cue_text()
    if text.strip() and not timings:
        raise UnsupportedFile("the file is not SubRip subtitles: no cue timing (00:00:01,000 --> …)")
    return _from_pieces(pieces, bom)


def read_html(data: bytes, inline: bool) -> Extracted:
    """With ``inline``, the text runs that only inline elements separate are one text (``HtmlPieces``)."""
    text, bom = _decode(data, "HTML")
    try:
        html = HtmlPieces(parse_html(text), inline)
    except HtmlError as e:
        raise InvalidFile(f"the HTML cannot be kept: {e}") from e
    return Extracted(html.texts, lambda t, ranges: bom + html.render(t, ranges).encode(), html.elements)
