"""Texts in, translations out, with sentences as the unit of batching.

``prepare`` segments every text (plain or HTML) into sentences that fit the model's input;
``translate_documents`` queues every sentence of every text as its own batcher item — so a long
document spreads over many batches and shares them with other requests — and reassembles
each text in order. The queue bound, the deadline and disconnect dropping apply per sentence
(the batcher admits a request's sentences all at once or not at all); an error in any sentence
is its text's error. Knows nothing of HTTP.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from service.engine.base import Encoded, TranslateEngine, TranslateItem, TranslateOptions, Translation
from service.queue import RequestQueue, off_the_loop_if_large
from service.text.document import Document, TextTranslation, assemble, html_document, plain_document
from service.text.html import HtmlError

Format = Literal["text", "html"]


@dataclass(frozen=True)
class Prepared:
    documents: list[Document | HtmlError]  # one per text: its sentences, or why its HTML failed
    # each unit's encoding, per text: tokenized once, for segmenting, the batcher's cost and the engine
    encodings: list[list[Encoded]]

    @property
    def n_sentences(self) -> int:
        return sum(len(d.units) for d in self.documents if isinstance(d, Document))


async def prepare(texts: Sequence[str], fmt: Format, language: str, engine: TranslateEngine) -> Prepared:
    chars = sum(len(t) for t in texts)
    return await off_the_loop_if_large(chars, lambda: _prepare(texts, fmt, language, engine))


def _prepare(texts: Sequence[str], fmt: Format, language: str, engine: TranslateEngine) -> Prepared:
    info = engine.manifest.translation
    if info is None:
        raise ValueError(f"{engine.manifest.name} is not a translation model")

    # split_long measures every unit it returns: each is tokenized once, and its encoding kept
    @functools.cache
    def encode(text: str) -> Encoded:
        return engine.encode([text])[0]

    def count(text: str) -> int:
        return encode(text).n_tokens

    build = html_document if fmt == "html" else plain_document
    documents: list[Document | HtmlError] = []
    for text in texts:
        try:
            documents.append(build(text, language, count, info.max_source_len))
        except HtmlError as e:
            documents.append(e)
    encodings = [[encode(u) for u in d.units] if isinstance(d, Document) else [] for d in documents]
    return Prepared(documents, encodings)


async def translate_documents(
    batcher: RequestQueue[TranslateItem, Any],
    prepared: Prepared,
    options: TranslateOptions,
    timeout_s: float,
) -> list[TextTranslation | Exception]:
    """Each text's translation, or the first error among its sentences; ``prepared`` must hold
    no ``HtmlError`` (the caller reports those first)."""
    documents = [d for d in prepared.documents if isinstance(d, Document)]
    if len(documents) != len(prepared.documents):
        raise ValueError("documents with HTML errors cannot be translated")
    encodings = [e for per_text in prepared.encodings for e in per_text]
    units = [unit for d in documents for unit in d.units]
    items = [TranslateItem(u, options, encoded=e) for u, e in zip(units, encodings, strict=True)]
    costs = [e.n_tokens for e in encodings]
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
