"""A file's inline elements through the registry's one request, and back to each text.

The registry sends file text ``i`` as one line of one document, its whitespace runs read as one
space and its edges stripped. ``to_document`` moves each text's elements onto that document;
``to_texts`` gives each text's elements their ranges in its translation (with the original's
edges put back), from their ranges in the translated document (``TextTranslation.placed``).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence

from service.files.pieces import Ranges
from service.text.inline import Element

_WORD = re.compile(r"\S+")


def _collapsed(text: str) -> Callable[[int], int]:
    """Where a position of ``text`` falls in ``" ".join(text.split())``: inside a word or at its
    end, at the same place of it; inside whitespace, after the one space left."""
    words = [m.span() for m in _WORD.finditer(text)]
    starts = [start for start, _ in words]
    at, moved = 0, []
    for start, end in words:
        moved.append(at)
        at += end - start + 1
    length = max(at - 1, 0)

    def position(p: int) -> int:
        k = bisect_right(starts, p) - 1
        if k < 0:
            return 0
        start, end = words[k]
        if p <= end:
            return moved[k] + p - start
        return moved[k] + end - start + 1 if k + 1 < len(words) else length

    return position


def to_document(texts: Sequence[str], elements: Sequence[Sequence[Element]]) -> list[Element]:
    """The elements of each text, over the document of the texts collapsed and joined by line
    breaks (parents renumbered)."""
    out: list[Element] = []
    offset = 0
    for text, mine in zip(texts, elements, strict=True):
        position, base = _collapsed(text), len(out)
        for e in mine:
            parent = e.parent + base if e.parent >= 0 else -1
            out.append(Element(offset + position(e.start), offset + position(e.end), parent))
        offset += len(" ".join(text.split())) + 1
    return out


def to_texts(
    placed: Sequence[tuple[int, int]], lines: Sequence[str], originals: Sequence[str], counts: Sequence[int]
) -> list[Ranges]:
    """Per translated line (of the text ``originals``, with ``counts`` elements): its elements'
    ranges in the line with its original's leading whitespace before it; None for a line
    without elements, or all when nothing was placed (``placed`` empty)."""
    if not placed:
        return [None] * len(lines)
    out: list[Ranges] = []
    offset = at = 0
    for line, original, n in zip(lines, originals, counts, strict=True):
        lead = len(original) - len(original.lstrip())

        def inside(p: int, line: str = line, offset: int = offset, lead: int = lead) -> int:
            return lead + min(max(p - offset, 0), len(line))

        out.append([(inside(a), inside(b)) for a, b in placed[at : at + n]] if n else None)
        at += n
        offset += len(line) + 1
    return out


def unchanged(elements: Sequence[Element]) -> Ranges:
    """The ranges of a text that comes back as it was (not sent: no letter in it)."""
    return [(e.start, e.end) for e in elements] if elements else None
