"""``ReverseTranslator`` held to the constrained search's contract (``TranslateOptions.required``):
each required phrase its reversed words lack is appended, so its output holds every one; a
phrase with a brace, which this small model's vocabulary cannot spell, makes its sentence fail
with ``ConstraintUnsatisfiable``, as the real engine's search does. Every item it receives is
kept, so a test sees each sentence's text and required phrases as the engine got them."""

from __future__ import annotations

import dataclasses
from typing import Any

from service.engine.base import TranslateItem, Translation
from service.engine.translation.constraints import ConstraintUnsatisfiable
from tests.service.small_engines import ReverseTranslator

UNSPELLABLE = "{}"


class KeepingTranslator(ReverseTranslator):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received: list[TranslateItem] = []

    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]:
        self.received.extend(items)
        out: list[Translation | Exception] = []
        for item, result in zip(items, super().translate(items), strict=True):
            required = item.options.required
            unspellable = [p for p in required if any(c in UNSPELLABLE for c in p)]
            if unspellable:
                out.append(ConstraintUnsatisfiable(f"cannot spell {unspellable[0]!r}"))
            elif isinstance(result, Exception):
                out.append(result)
            else:
                out.append(_with(result, required))
        return out


def _with(result: Translation, required: tuple[str, ...]) -> Translation:
    def held(text: str) -> str:
        return " ".join([text, *(p for p in required if p not in text)])

    hypotheses = [dataclasses.replace(h, text=held(h.text)) for h in result.hypotheses]
    return dataclasses.replace(result, hypotheses=hypotheses)
