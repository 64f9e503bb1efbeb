"""Texts in, translations out, with sentences as the unit of batching.

``prepare`` segments every text (plain or HTML) into sentences that fit the model's input;
``translate_documents`` queues every sentence of every text as its own batcher item — so a long
document spreads over many batches and shares them with other requests — and reassembles
each text in order. The queue bound, the deadline and disconnect dropping apply per sentence
(the batcher admits a request's sentences all at once or not at all); an error in any sentence
is its text's error. Knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from service.batching import DynamicBatcher
from service.engine.base import TranslateEngine, TranslateItem, TranslateOptions, Translation
from service.text.document import Document, TextTranslation, assemble, html_document, plain_document
from service.text.html import HtmlError

Format = Literal["text", "html"]

_LARGE_CHARS = 16_384  # above this, segment and count tokens on a thread, not on the event loop


@dataclass(frozen=True)
class Prepared:
    documents: list[Document | HtmlError]  # one per text: its sentences, or why its HTML failed
    costs: list[list[int]]  # tokens of each unit, per text (the batcher's cost, counted once)

    @property
    def n_sentences(self) -> int:
        return sum(len(d.units) for d in self.documents if isinstance(d, Document))


async def prepare(texts: Sequence[str], fmt: Format, language: str, engine: TranslateEngine) -> Prepared:
    if sum(len(t) for t in texts) > _LARGE_CHARS:
        return await asyncio.to_thread(_prepare, texts, fmt, language, engine)
    return _prepare(texts, fmt, language, engine)


def _prepare(texts: Sequence[str], fmt: Format, language: str, engine: TranslateEngine) -> Prepared:
    info = engine.manifest.translation
    if info is None:
        raise ValueError(f"{engine.manifest.name} is not a translation model")
    count = functools.cache(engine.count_tokens)  # split_long counts every unit it returns
    build = html_document if fmt == "html" else plain_document
    documents: list[Document | HtmlError] = []
    for text in texts:
        try:
            documents.append(build(text, language, count, info.max_source_len))
        except HtmlError as e:
            documents.append(e)
    costs = [[count(u) for u in d.units] if isinstance(d, Document) else [] for d in documents]
    return Prepared(documents, costs)


async def translate_documents(
    batcher: DynamicBatcher[TranslateItem, Any],
    prepared: Prepared,
    options: TranslateOptions,
    timeout_s: float,
) -> list[TextTranslation | Exception]:
    """Each text's translation, or the first error among its sentences; ``prepared`` must hold
    no ``HtmlError`` (the caller reports those first)."""
    documents = [d for d in prepared.documents if isinstance(d, Document)]
    if len(documents) != len(prepared.documents):
        raise ValueError("documents with HTML errors cannot be translated")
    items = [TranslateItem(unit, options) for d in documents for unit in d.units]
    costs = [c for per_text in prepared.costs for c in per_text]
    results = await batcher.submit(items, timeout_s, costs) if items else []
    out: list[TextTranslation | Exception] = []
    start = 0
    for document in documents:
        mine = results[start : start + len(document.units)]
        start += len(document.units)
        error = next((r for r in mine if isinstance(r, Exception)), None)
        translations = [r for r in mine if isinstance(r, Translation)]
        out.append(error if error is not None else assemble(document, translations))
    return out
