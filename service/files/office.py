"""Office documents: Word (.docx) and PowerPoint (.pptx) as Office Open XML, and OpenDocument
text (.odt) and presentations (.odp), all ZIP archives of XML parts.

The archive is opened by ``safe_zip`` and each part read by ``safe_xml``; a paragraph is the unit
translated (a sentence often spans formatting runs: a bold word, a link, a spell-check
boundary). Runs inside a paragraph: the paragraph's text is translated whole, and each text
slot (a ``w:t``, ``a:t``, an ODF span's text or an element's tail) is an inline element of it,
placed on the translation by the alignment (``service/text/inline.py``); ``fill`` gives every
character of the translation to a slot, so none is lost, and a slot that aligns to nothing
stays, empty or with a gap's text. Without ranges (a model without alignments, a paragraph of
more than ``MAX_RUNS`` slots) the translation goes into the first slot that holds text and the
others are emptied. Either way every run element, its properties, field, footnote reference,
tab and break stays where it was. What is translated:

* .docx: ``w:p`` of the body, headers, footers, footnotes, endnotes and comments; its text is
  the ``w:t`` elements whose nearest paragraph it is (a text box's paragraphs are their own).
* .pptx: ``a:p`` of the slides and the speaker notes (``a:t``).
* .odt, .odp: ``text:p`` and ``text:h`` of ``content.xml`` and ``styles.xml`` (headers, footers);
  its text is its own text and that of its spans and links (``text:span``, ``text:a``) and what
  follows each child element; fields, notes and frames inside it are left as they are.

python-docx and python-pptx were compared: each reads one format, walks the body's paragraphs
(text boxes, notes and comments need raw XML anyway) and parses with lxml without defusedxml's
checks; one walk over the parts' XML covers the four formats.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.files import safe_xml
from service.files.pieces import Extracted, Ranges
from service.files.refusals import UnsupportedFile
from service.files.safe_zip import Archive, ZipLimits
from service.text.inline import Element, fill

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
_TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_ODF_RUNS = frozenset({f"{_TEXT}span", f"{_TEXT}a"})
# Slots of a paragraph placed by the alignment: beyond, its placement costs more than it keeps
MAX_RUNS = 512

Slot = tuple[Any, str]  # an element and "text" or "tail"


@dataclass(frozen=True)
class _Kind:
    name: str  # as the refusals say it
    parts: re.Pattern[str]  # the archive entries translated
    paragraphs: tuple[str, ...]
    slots: Callable[[Any], list[Slot]]  # a paragraph's text, in order
    is_mine: Callable[[Archive], bool]  # the archive is of this kind


def _ooxml_slots(text_tag: str, paragraph_tag: str) -> Callable[[Any], list[Slot]]:
    def slots(paragraph: Any) -> list[Slot]:
        return [
            (t, "text")
            for t in paragraph.iter(text_tag)
            if next(t.iterancestors(paragraph_tag), None) is paragraph
        ]

    return slots


def _odf_slots(paragraph: Any) -> list[Slot]:
    found: list[Slot] = [(paragraph, "text")]
    for child in paragraph:
        if child.tag in _ODF_RUNS:
            found += _odf_slots(child)
        found.append((child, "tail"))
    return found


def _ooxml(name: str, parts: str, namespace: str, main_part: str) -> _Kind:
    """An Office Open XML kind: paragraphs ``p`` holding text in ``t``, both in ``namespace``."""
    return _Kind(
        name,
        re.compile(parts),
        (f"{namespace}p",),
        _ooxml_slots(f"{namespace}t", f"{namespace}p"),
        lambda archive: archive.has("[Content_Types].xml") and archive.has(main_part),
    )


def _odf(name: str, mimetype: bytes) -> _Kind:
    """An OpenDocument kind: the same parts and paragraphs for all, told apart by the mimetype."""
    return _Kind(
        name,
        re.compile(r"content\.xml|styles\.xml"),
        (f"{_TEXT}p", f"{_TEXT}h"),
        _odf_slots,
        lambda archive: archive.has("mimetype") and archive.read("mimetype").strip() == mimetype,
    )


KINDS = {
    ".docx": _ooxml(
        "Word document",
        r"word/(?:document|header\d*|footer\d*|footnotes|endnotes|comments)\.xml",
        _W,
        "word/document.xml",
    ),
    ".pptx": _ooxml(
        "PowerPoint presentation",
        r"ppt/(?:slides/slide\d+|notesSlides/notesSlide\d+)\.xml",
        _A,
        "ppt/presentation.xml",
    ),
    ".odt": _odf("OpenDocument text", b"application/vnd.oasis.opendocument.text"),
    ".odp": _odf("OpenDocument presentation", b"application/vnd.oasis.opendocument.presentation"),
}


def office_reader(extension: str) -> Callable[[bytes, ZipLimits, bool], Extracted]:
    kind = KINDS[extension]

    def read(data: bytes, limits: ZipLimits, _inline: bool) -> Extracted:
        archive = Archive(data, limits, kind.name)
        if not kind.is_mine(archive):
            raise UnsupportedFile(f"the file is not a {kind.name}: its archive lacks the parts one has")
        trees: dict[str, Any] = {}
        paragraphs: list[list[Slot]] = []
        for name in archive.names:
            if kind.parts.fullmatch(name):
                trees[name] = safe_xml.parse(archive.read(name), name)
                for paragraph in trees[name].iter(*kind.paragraphs):
                    slots = kind.slots(paragraph)
                    if any(_get(slot) for slot in slots):
                        paragraphs.append(slots)

        def rebuild(translations: list[str], ranges: list[Ranges]) -> bytes:
            for slots, translation, placed in zip(paragraphs, translations, ranges, strict=True):
                _put([slot for slot in slots if _get(slot)], translation, placed)
            return archive.rebuild({name: safe_xml.serialize(tree) for name, tree in trees.items()})

        texts = ["".join(_get(slot) for slot in slots) for slots in paragraphs]
        return Extracted(texts, rebuild, [_runs(slots) for slots in paragraphs])

    return read


def _get(slot: Slot) -> str:
    element, attribute = slot
    return str(getattr(element, attribute) or "")


def _runs(slots: list[Slot]) -> tuple[Element, ...]:
    """Each slot holding text as an element over the paragraph's text; none for one slot (it
    takes the whole translation) or more than ``MAX_RUNS``."""
    lengths = [len(_get(slot)) for slot in slots if _get(slot)]
    if not 1 < len(lengths) <= MAX_RUNS:
        return ()
    out, at = [], 0
    for length in lengths:
        out.append(Element(at, at + length, -1))
        at += length
    return tuple(out)


def _put(slots: list[Slot], translation: str, ranges: Ranges) -> None:
    """``translation`` over the ``slots`` holding text: each its part of ``fill``'s partition of
    ``ranges``; without ranges, the whole in the first and the others emptied."""
    if ranges is None or len(ranges) != len(slots):
        parts = [(0, len(translation))] + [(0, 0)] * (len(slots) - 1)
    else:
        parts = fill(ranges, [len(_get(slot)) for slot in slots], len(translation))
    for (element, attribute), (start, end) in zip(slots, parts, strict=True):
        setattr(element, attribute, translation[start:end] or None)
        if end > start and element.tag == f"{_W}t":
            element.set(_XML_SPACE, "preserve")  # else Word drops the text's edge spaces
