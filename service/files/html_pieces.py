"""An HTML document's texts as the file registry sends them, and the document back.

With ``inline`` (every model the file may go to has alignments), the text runs that only inline
elements separate are one text, its elements (``service/text/inline_html.py``) placed on its
translation by the alignment, as a ``"format": "html"`` request does; without, each text run is
a text of its own, its tags left in place, as such a model translates HTML. A readable
attribute's value is a text of its own either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.files.pieces import Ranges
from service.text.html import HtmlDocument
from service.text.inline import Element
from service.text.inline_html import Block, inline_html


class HtmlPieces:
    def __init__(self, document: HtmlDocument, inline: bool) -> None:
        self.layout = inline_html(document, inline)
        units = self.layout.units
        self.texts = [u.text if isinstance(u, Block) else document.texts[u] for u in units]
        self.elements: list[tuple[Element, ...]] = [
            tuple(u.elements) if isinstance(u, Block) else () for u in self.layout.units
        ]

    def render(self, translations: Sequence[str], ranges: Sequence[Ranges]) -> str:
        """The document with each text's translation, its elements at their ``ranges`` of it
        (None: around all of it)."""
        parts = []
        for unit, text, placed in zip(self.layout.units, translations, ranges, strict=True):
            if isinstance(unit, Block):
                n = len(unit.elements)
                parts.append(
                    unit.render(text, placed if placed is not None else [(0, len(text))] * n, range(n))
                )
            else:
                parts.append(text)  # an attribute's value: escaped as one by the layout
        return self.layout.render(parts)
