"""Texts as sentences, the unit of batching, and back.

``split`` segments every text (plain or HTML) into sentences that fit the model's input and
tokenizes each once; every sentence of every text becomes its own queue item (``items``), so a
long document spreads over many batches and shares them with other requests; ``assemble`` puts
each text back together in order. The queue bound, the deadline and disconnect dropping apply
per sentence (the queue admits a request's sentences all at once or not at all); an error in
any sentence is its text's error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from service.engine.base import Encoded, TranslateEngine, TranslateItem, TranslateOptions, Translation
from service.engine.tokenizer import EncodingCache
from service.glossaries.placeholders import Masked, PlaceholderLost
from service.queue import off_the_loop_if_large
from service.serving.failures import Problem, problem
from service.serving.terminology import Required, SentenceTerms
from service.text.document import Document, TextTranslation, assemble, html_document, plain_document
from service.text.html import HtmlError
from service.text.inline import Element

Format = Literal["text", "html"]
NO_TERMS = SentenceTerms()


@dataclass(frozen=True)
class Sentences:
    documents: list[Document | HtmlError]  # one per text: its sentences, or why its HTML failed
    # each unit's encoding, per text: tokenized once, for segmenting, the queue's cost and the engine
    encodings: list[list[Encoded]]
    # each unit as the engine gets it (kept spans masked), and the phrases its output must hold
    masked: list[list[Masked]]
    required: list[list[tuple[Required, ...]]]
    # each unit whose inline elements are placed by the alignment (HTML): it asks for one
    aligned: list[list[bool]]

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
        units = [m.text for per_text in self.masked for m in per_text]
        required = [r for per_text in self.required for r in per_text]
        aligned = [a for per_text in self.aligned for a in per_text]
        items = [
            TranslateItem(u, _with(options, r, a), encoded=e)
            for u, e, r, a in zip(units, encodings, required, aligned, strict=True)
        ]
        return items, [e.n_tokens for e in encodings]

    def assemble(self, results: Sequence[Translation | Exception]) -> list[TextTranslation | Exception]:
        """Each text's translation from its sentences' ``results`` (in ``items``' order), or the
        first error among them."""
        out: list[TextTranslation | Exception] = []
        start = 0
        for document, masked in zip(self.documents, self.masked, strict=True):
            assert isinstance(document, Document)  # as items() checked
            mine = [
                _restored(r, m) for r, m in zip(results[start : start + len(masked)], masked, strict=True)
            ]
            start += len(masked)
            error = next((r for r in mine if isinstance(r, Exception)), None)
            translations = [r for r in mine if isinstance(r, Translation)]
            out.append(error if error is not None else assemble(document, translations))
        return out


async def split(
    texts: Sequence[str],
    fmt: Format,
    language: str,
    engine: TranslateEngine,
    terms: SentenceTerms = NO_TERMS,
    elements: Sequence[Sequence[Element]] = (),
) -> Sentences:
    """``elements``: per plain text (none: no text has any), its inline elements."""
    chars = sum(len(t) for t in texts)
    return await off_the_loop_if_large(chars, lambda: _split(texts, fmt, language, engine, terms, elements))


def _with(options: TranslateOptions, required: tuple[Required, ...], aligned: bool) -> TranslateOptions:
    if not required and (options.alignments or not aligned):
        return options
    return dataclasses.replace(
        options,
        required=tuple(phrase for phrase, _ in required),
        required_sources=tuple(span for _, span in required),
        alignments=options.alignments or aligned,
    )


def _restored(result: Translation | Exception, masked: Masked) -> Translation | Exception:
    """``result`` with each hypothesis's placeholders replaced by the spans they stand for."""
    if isinstance(result, Exception) or not masked.kept:
        return result
    try:
        hypotheses = [dataclasses.replace(h, text=masked.restore(h.text)) for h in result.hypotheses]
    except PlaceholderLost as e:
        return e
    return dataclasses.replace(result, hypotheses=hypotheses)


def _split(
    texts: Sequence[str],
    fmt: Format,
    language: str,
    engine: TranslateEngine,
    terms: SentenceTerms,
    elements: Sequence[Sequence[Element]],
) -> Sentences:
    info = engine.manifest.translation
    if info is None:
        raise ValueError(f"{engine.manifest.name} is not a translation model")

    encode = EncodingCache(engine.encode)  # split_long measures every unit it returns: kept
    documents: list[Document | HtmlError] = []
    for t, text in enumerate(texts):
        try:
            if fmt == "html":  # inline elements are placed by the alignment where the model has one
                documents.append(
                    html_document(text, language, encode.count, info.max_source_len, info.has_alignments)
                )
            else:  # a model without alignments leaves the elements where they were
                placed = elements[t] if elements and info.has_alignments else ()
                documents.append(plain_document(text, language, encode.count, info.max_source_len, placed))
        except HtmlError as e:
            documents.append(e)
    prepared = [[terms.prepare(u) for u in d.units] if isinstance(d, Document) else [] for d in documents]
    masked = [[m for m, _ in per_text] for per_text in prepared]
    encodings = [[encode(m.text) for m in per_text] for per_text in masked]
    required = [[r for _, r in per_text] for per_text in prepared]
    aligned = [d.aligned_units if isinstance(d, Document) else [] for d in documents]
    return Sentences(documents, encodings, masked, required, aligned)
