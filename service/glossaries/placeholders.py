"""Do-not-translate spans: each occurrence in a sentence is replaced by a placeholder, the
placeholder is required in the translation, and the span's own characters are put back in its
place after decoding.

A placeholder is ``@1@``, ``@2@``... : characters every default model's target vocabulary spells
(``▁ @ 1 @``) and that cannot be read as another placeholder's start (``@1@`` is no part of
``@11@``). Of the markers they spell, ``@`` is the one the default models copy with the least
noise: with ``#`` they add stray ``#`` (``#1###``), with a letter they go on into a word
(``X1Xylophon``); ``~`` and ``^`` they cannot spell at all. When the sentence already holds the
marker, the next of ``MARKERS`` that it does not hold is used, so a placeholder never stands for
text the sentence had. A span is kept as the request wrote it, whatever its characters:
``{count}``, markup, words the vocabulary lacks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MARKERS = "@%#"


class PlaceholderLost(ValueError):
    """A translation without one of its placeholders (the engine was to keep each)."""


@dataclass(frozen=True)
class Masked:
    text: str  # the sentence with each kept span replaced by its placeholder
    kept: tuple[tuple[str, str], ...] = ()  # (placeholder, the span it replaces), in order

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for p, _ in self.kept))

    def restore(self, translation: str) -> str:
        """``translation`` with each placeholder replaced by its span, byte for byte."""
        if not self.kept:
            return translation
        spans = dict(self.kept)  # one placeholder per distinct span
        missing = [p for p in spans if p not in translation]
        if missing:
            raise PlaceholderLost(f"the translation lost the placeholder(s) {', '.join(missing)}")
        pattern = re.compile("|".join(re.escape(p) for p in spans))
        return pattern.sub(lambda found: spans[found.group()], translation)


def mask(sentence: str, keep: Sequence[str]) -> Masked:
    """``sentence`` with every occurrence of each ``keep`` span replaced (a longer span before a
    shorter one it overlaps); one placeholder per distinct span."""
    spans = sorted({k for k in keep if k and k in sentence}, key=len, reverse=True)
    if not spans:
        return Masked(sentence)
    marker = next((m for m in MARKERS if m not in sentence), None)
    if marker is None:
        raise ValueError(f"the sentence holds every placeholder marker ({MARKERS})")
    numbers = {span: f"{marker}{n}{marker}" for n, span in enumerate(spans, start=1)}
    pattern = re.compile("|".join(re.escape(s) for s in spans))
    kept: list[tuple[str, str]] = []

    def placeholder_of(found: re.Match[str]) -> str:
        kept.append((numbers[found.group()], found.group()))
        return numbers[found.group()]

    text = pattern.sub(placeholder_of, sentence)
    return Masked(text, tuple(kept))
