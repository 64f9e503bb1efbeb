"""A file's text as verbatim markup around translatable texts, and ``Extracted``: what every
format gives the registry (the texts, their inline elements, and the way back to the file's bytes).

A text is only what a translator can change: its leading and trailing whitespace stays in the
markup, and a text without a letter (numbers, punctuation, a table rule) is markup too, so that
neither costs a model call nor comes back altered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from service.text.inline import Element

# A text's elements' [start, end) in its translation; None: not placed (the format's own fallback)
Ranges = list[tuple[int, int]] | None


@dataclass(frozen=True)
class Extracted:
    """The file's texts in document order, and ``rebuild``: its bytes with each text replaced by
    its translation, its elements at their ranges of it (one of each per text, in order)."""

    texts: list[str]
    rebuild: Callable[[list[str], list[Ranges]], bytes]
    # per text: its inline elements over it (a paragraph's runs, HTML's inline elements); none: []
    elements: list[tuple[Element, ...]] = field(default_factory=list)


def translatable(text: str) -> bool:
    return any(c.isalpha() for c in text)


def with_edges(original: str, translation: str) -> str:
    """``translation`` with ``original``'s leading and trailing whitespace."""
    stripped = original.strip()
    if not stripped:
        return original
    start = original.index(stripped)
    return original[:start] + translation + original[start + len(stripped) :]


class Pieces:
    """``markup[0] + texts[0] + markup[1] + … + texts[-1] + markup[-1]``, built left to right."""

    def __init__(self) -> None:
        self.markup: list[str] = [""]
        self.texts: list[str] = []

    def add_markup(self, markup: str) -> None:
        self.markup[-1] += markup

    def add_text(self, text: str) -> None:
        """``text``: its whitespace edges, or all of it when it has no letter, join the markup."""
        stripped = text.strip()
        if not translatable(stripped):
            self.add_markup(text)
            return
        start = text.index(stripped)
        self.add_markup(text[:start])
        self.texts.append(stripped)
        self.markup.append(text[start + len(stripped) :])

    def render(self, translations: Sequence[str]) -> str:
        if len(translations) != len(self.texts):
            raise ValueError(f"{len(translations)} translations for {len(self.texts)} texts")
        out = [self.markup[0]]
        for translation, markup in zip(translations, self.markup[1:], strict=True):
            out += [translation, markup]
        return "".join(out)
