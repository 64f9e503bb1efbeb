"""Texts as sentences, the unit of batching, and back.

``split`` segments every text (plain or HTML) into sentences that fit the model's input and
tokenizes each once; every sentence of every text becomes its own queue item (``items``), so a
long document spreads over many batches and shares them with other requests; ``assemble`` puts
each text back together in order. The queue bound, the deadline and disconnect dropping apply
per sentence (the queue admits a request's sentences all at once or not at all); an error in
any sentence is its text's error.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from service.engine.base import Encoded, TranslateEngine, TranslateItem, TranslateOptions, Translation
from service.queue import off_the_loop_if_large
from service.serving.errors import Problem, problem
from service.text.document import Document, TextTranslation, assemble, html_document, plain_document
from service.text.html import HtmlError

Format = Literal["text", "html"]


@dataclass(frozen=True)
class Sentences:
    documents: list[Document | HtmlError]  # one per text: its sentences, or why its HTML failed
    # each unit's encoding, per text: tokenized once, for segmenting, the queue's cost and the engine
    encodings: list[list[Encoded]]

    @property
    def count(self) -> int:
        return sum(len(d.units) for d in self.documents if isinstance(d, Document))

    def html_problems(self, field: str) -> list[Problem]:
        """Each text whose HTML cannot be kept."""
        return [
            problem("html_invalid", (field, i), str(d))
            for i, d in enumerate(self.documents)
            if isinstance(d, HtmlError)
        ]

    def items(self, options: TranslateOptions) -> tuple[list[TranslateItem], list[int]]:
        """Every sentence's item in order, and its cost (its tokens); the texts' HTML must be
        valid (``html_problems`` are reported first)."""
        if any(isinstance(d, HtmlError) for d in self.documents):
            raise ValueError("documents with HTML errors cannot be translated")
        encodings = [e for per_text in self.encodings for e in per_text]
        units = [unit for d in self.documents if isinstance(d, Document) for unit in d.units]
        items = [TranslateItem(u, options, encoded=e) for u, e in zip(units, encodings, strict=True)]
        return items, [e.n_tokens for e in encodings]

    def assemble(self, results: Sequence[Translation | Exception]) -> list[TextTranslation | Exception]:
        """Each text's translation from its sentences' ``results`` (in ``items``' order), or the
        first error among them."""
        out: list[TextTranslation | Exception] = []
        start = 0
        for document in self.documents:
            assert isinstance(document, Document)  # as items() checked
            mine = results[start : start + len(document.units)]
            start += len(document.units)
            error = next((r for r in mine if isinstance(r, Exception)), None)
            translations = [r for r in mine if isinstance(r, Translation)]
            out.append(error if error is not None else assemble(document, translations))
        return out


async def split(texts: Sequence[str], fmt: Format, language: str, engine: TranslateEngine) -> Sentences:
    chars = sum(len(t) for t in texts)
    return await off_the_loop_if_large(chars, lambda: _split(texts, fmt, language, engine))


def _split(texts: Sequence[str], fmt: Format, language: str, engine: TranslateEngine) -> Sentences:
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
    return Sentences(documents, encodings)
