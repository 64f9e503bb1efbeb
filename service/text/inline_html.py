"""An HTML document's text as blocks: the text runs that only inline elements separate, joined.

``parse_html`` cuts the text at every tag; a sentence with a bold word would then be translated
as three pieces. Here runs separated only by the start and end tags of inline elements (and
whitespace) form one block, translated as plain text; each element is put back by the
alignment (``service/text/inline.py``), its start and end tags as they were written. A block
also owns the inline start tags just before it and the end tags just after it
(``<p><b>Two</b> dogs</p>``).

Anything else ends a block: another tag (``<br>``, ``<img>``, ``<code>``, a block element), a
comment, a translated attribute. A block whose inline tags do not nest within it (an element
left open, ``<b><i>x</b></i>``), nested deeper than ``MAX_DEPTH`` or with more than
``MAX_ELEMENTS`` elements is translated as before: each run alone, its tags left in place.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import unescape

from service.text.html import BLANK_REFERENCE, HtmlDocument, RunKind, escape_run
from service.text.inline import Element

INLINE = frozenset(
    {"a", "abbr", "b", "bdi", "bdo", "big", "cite", "data", "del", "dfn", "em", "font", "i", "ins", "mark"}
    | {"q", "s", "small", "span", "strike", "strong", "sub", "sup", "time", "u"}
)
MAX_DEPTH = 32
MAX_ELEMENTS = 512
_PART = re.compile(
    r"""(?P<tag><(?P<close>/?)(?P<name>[A-Za-z][^\t\n\r\f />]*)(?:[^>"'/]|"[^"]*"|'[^']*'|/(?!>))*>)"""
    rf"""|(?P<blank>(?:\s|{BLANK_REFERENCE})+)|(?P<other><!--.*?-->|.)""",
    re.DOTALL,
)
_OPEN, _CLOSE, _BLANK, _OTHER = "open", "close", "blank", "other"


@dataclass(frozen=True)
class Block:
    text: str  # the plain text: its runs and the whitespace between them, references decoded
    elements: list[Element]  # in document order, parents first
    tags: list[tuple[str, str]]  # each element's start and end tag as written

    def render(self, text: str, ranges: Sequence[tuple[int, int]], elements: Sequence[int]) -> str:
        """``text`` escaped with the ``elements`` (indices into the block's, nested as they are)
        around their ``ranges`` of it."""
        out: list[str] = []
        stack: list[tuple[int, int]] = []  # (element, end) of the open ones
        at = 0
        for index, (start, end) in zip(elements, ranges, strict=True):
            while stack and (stack[-1][1] < start or not self._inside(index, stack[-1][0])):
                at = self._close(text, out, stack, at)
            out.append(_escaped(text[at:start]))
            out.append(self.tags[index][0])
            stack.append((index, end))
            at = start
        while stack:
            at = self._close(text, out, stack, at)
        out.append(_escaped(text[at:]))
        return "".join(out)

    def _inside(self, index: int, ancestor: int) -> bool:
        parent = self.elements[index].parent
        while parent > ancestor:
            parent = self.elements[parent].parent
        return parent == ancestor

    def _close(self, text: str, out: list[str], stack: list[tuple[int, int]], at: int) -> int:
        index, end = stack.pop()
        out.append(_escaped(text[at:end]))
        out.append(self.tags[index][1])
        return end


@dataclass(frozen=True)
class InlineHtml:
    """``markup[0] + unit 0 + markup[1] + …``: a unit is a block, or a translated attribute
    value (the run's index in ``document``)."""

    document: HtmlDocument
    markup: list[str]
    units: list[Block | int]

    def render(self, translations: Sequence[str]) -> str:
        """One rendered string per unit (a block's, from ``Block.render``; a value's, plain)."""
        parts = [self.markup[0]]
        for unit, translation, markup in zip(self.units, translations, self.markup[1:], strict=True):
            if isinstance(unit, int):
                doc = self.document
                translation = escape_run(translation, doc.kinds[unit], doc.quotes[unit])
            parts += [translation, markup]
        return "".join(parts)


def inline_html(document: HtmlDocument, inline: bool = True) -> InlineHtml:
    """``document``'s units; with ``inline`` False, each text run is a block of its own."""
    parts = [_parts(chunk) for chunk in document.markup]
    texts, kinds = document.texts, document.kinds
    markup: list[str] = []
    units: list[Block | int] = []
    rest = document.markup[0]
    run = 0
    while run < len(texts):
        last = run
        if kinds[run] is RunKind.TEXT and inline:
            while last + 1 < len(texts) and kinds[last + 1] is RunKind.TEXT and _inline(parts[last + 1]):
                last += 1
        block = _block(document, parts, run, last) if kinds[run] is RunKind.TEXT and inline else None
        if block is None:  # each run alone, as before
            for alone in range(run, last + 1):
                units.append(Block(texts[alone], [], []) if kinds[alone] is RunKind.TEXT else alone)
                markup.append(rest)
                rest = document.markup[alone + 1]
            run = last + 1
            continue
        found, prefix, suffix = block
        markup.append(rest[: len(rest) - prefix])
        units.append(found)
        rest = document.markup[last + 1][suffix:]
        run = last + 1
    markup.append(rest)
    return InlineHtml(document, markup, units)


def _parts(chunk: str) -> list[tuple[str, str, str]]:
    """(kind, source, tag name) of each piece of a markup chunk."""
    out = []
    for m in _PART.finditer(chunk):
        if m["tag"] and m["name"].lower() in INLINE and not m["tag"].endswith("/>"):
            out.append((_CLOSE if m["close"] else _OPEN, m[0], m["name"].lower()))
        elif m["blank"]:
            out.append((_BLANK, m[0], ""))
        else:
            out.append((_OTHER, m[0], ""))
    return out


def _inline(parts: list[tuple[str, str, str]]) -> bool:
    return all(kind != _OTHER for kind, _, _ in parts)


def _block(
    document: HtmlDocument, parts: list[list[tuple[str, str, str]]], first: int, last: int
) -> tuple[Block, int, int] | None:
    """Runs ``first``..``last`` as a block, with the characters it owns of the chunk before it
    and of the chunk after it; None when its elements do not nest within it."""
    before = _edge(parts[first], _OPEN, from_end=True)
    after = _edge(parts[last + 1], _CLOSE, from_end=False)
    sequence: list[tuple[str, str, str]] = list(before)
    for run in range(first, last + 1):
        sequence.append(("run", document.texts[run], ""))
        sequence += after if run == last else parts[run + 1]
    text: list[str] = []
    length = 0
    elements: list[Element] = []
    tags: list[tuple[str, str]] = []
    open_: list[tuple[int, str]] = []
    for kind, source, name in sequence:
        if kind == _OPEN:
            if len(open_) >= MAX_DEPTH or len(elements) >= MAX_ELEMENTS:
                return None
            open_.append((len(elements), name))
            elements.append(Element(length, length, open_[-2][0] if len(open_) > 1 else -1))
            tags.append((source, ""))
        elif kind == _CLOSE:
            if not open_ or open_[-1][1] != name:
                return None
            index, _ = open_.pop()
            elements[index] = Element(elements[index].start, length, elements[index].parent)
            tags[index] = (tags[index][0], source)
        else:
            piece = source if kind == "run" else unescape(source)
            text.append(piece)
            length += len(piece)
    if open_:
        return None
    owned_before = sum(len(source) for _, source, _ in before)
    owned_after = sum(len(source) for _, source, _ in after)
    return Block("".join(text), elements, tags), owned_before, owned_after


def _edge(parts: list[tuple[str, str, str]], kind: str, from_end: bool) -> list[tuple[str, str, str]]:
    """The tags of ``kind`` (and the whitespace among them) at one end of a chunk, starting at a tag."""
    ordered = parts[::-1] if from_end else parts
    taken: list[tuple[str, str, str]] = []
    for part in ordered:
        if part[0] not in (kind, _BLANK):
            break
        taken.append(part)
    while taken and taken[-1][0] == _BLANK:  # the chunk's own whitespace stays outside
        taken.pop()
    return taken[::-1] if from_end else taken


def _escaped(text: str) -> str:
    return escape_run(text, RunKind.TEXT, "")
