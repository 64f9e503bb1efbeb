"""A text to translate as the sentences the model takes, and the way back to the text's shape.

``plain_document`` and ``html_document`` cut a text into sentences (and an over-long sentence
into pieces that fit the model's input); ``units`` are the strings the engine translates, one
queue item each. ``assemble`` puts the engine's per-unit translations back together: pieces
into their sentence, sentences into the text's own layout (whitespace, line breaks, list
markers, HTML markup), for each of the n best hypotheses.

Definitions (the API documents them):

* A sentence split into pieces gets the pieces' texts joined by the source's separators, their
  target tokens concatenated, and a block-diagonal alignment (each piece attends only to its
  own source tokens).
* The score of a sentence or a text is the mean of its parts' scores weighted by their output
  tokens; with ``length_penalty`` 1 that is the log-probability per output token of the whole.
* Hypothesis k of a text is each sentence's k-th hypothesis in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.engine.base import Translation, TranslationHypothesis
from service.text.html import parse_html
from service.text.segment import Segmented, segment, split_long


@dataclass(frozen=True)
class Sentence:
    text: str
    span: tuple[int, int] | None  # [start, end) in the input text; None in HTML (decoded text runs)
    pieces: list[tuple[str, str]]  # (piece, separator after it): more than one when over the input


@dataclass(frozen=True)
class Document:
    sentences: list[Sentence]
    render: Callable[[list[str]], str]  # one translation per sentence → the text in its own shape

    @property
    def units(self) -> list[str]:
        return [piece for sentence in self.sentences for piece, _ in sentence.pieces]


@dataclass(frozen=True)
class SentenceTranslation:
    source: str
    span: tuple[int, int] | None
    pieces: int
    hypotheses: list[TranslationHypothesis]  # best first; tokens and alignment over all pieces
    source_tokens: list[str]


@dataclass(frozen=True)
class TextHypothesis:
    text: str
    score: float


@dataclass(frozen=True)
class TextTranslation:
    hypotheses: list[TextHypothesis]  # best first, n_best of them
    sentences: list[SentenceTranslation]
    n_input_tokens: int
    n_output_tokens: int  # of the best hypothesis


CountTokens = Callable[[str], int]


def plain_document(text: str, language: str, count_tokens: CountTokens, max_tokens: int) -> Document:
    segmented = segment(text, language)
    sentences = [
        Sentence(s, span, split_long(s, count_tokens, max_tokens))
        for s, span in zip(segmented.sentences, segmented.spans, strict=True)
    ]
    return Document(sentences, segmented.join)


def html_document(text: str, language: str, count_tokens: CountTokens, max_tokens: int) -> Document:
    """Text runs of the HTML (``HtmlError`` when it cannot be kept faithfully), each segmented."""
    html = parse_html(text)
    runs = [segment(run, language) for run in html.texts]
    sentences = [
        Sentence(s, None, split_long(s, count_tokens, max_tokens)) for run in runs for s in run.sentences
    ]

    def render(translations: list[str]) -> str:
        return html.render(_per_run(runs, translations))

    return Document(sentences, render)


def _per_run(runs: Sequence[Segmented], translations: list[str]) -> list[str]:
    out, start = [], 0
    for run in runs:
        out.append(run.join(translations[start : start + len(run.sentences)]))
        start += len(run.sentences)
    return out


def assemble(document: Document, translations: Sequence[Translation]) -> TextTranslation:
    """The text's translation from its units' translations (in ``document.units`` order)."""
    sentences, start = [], 0
    for sentence in document.sentences:
        parts = translations[start : start + len(sentence.pieces)]
        start += len(sentence.pieces)
        sentences.append(_sentence(sentence, parts))
    n_best = max((len(s.hypotheses) for s in sentences), default=1)
    hypotheses = []
    for k in range(n_best):
        chosen = [s.hypotheses[min(k, len(s.hypotheses) - 1)] for s in sentences]
        text = document.render([h.text for h in chosen])
        hypotheses.append(TextHypothesis(text, _weighted_score(chosen)))
    return TextTranslation(
        hypotheses=hypotheses,
        sentences=sentences,
        n_input_tokens=sum(t.n_input_tokens for t in translations),
        n_output_tokens=sum(t.n_output_tokens for t in translations),
    )


def _sentence(sentence: Sentence, parts: Sequence[Translation]) -> SentenceTranslation:
    if len(parts) == 1:
        only = parts[0]
        return SentenceTranslation(sentence.text, sentence.span, 1, only.hypotheses, only.source_tokens)
    n_best = max(len(p.hypotheses) for p in parts)
    separators = [separator for _, separator in sentence.pieces]
    hypotheses = []
    for k in range(n_best):
        chosen = [p.hypotheses[min(k, len(p.hypotheses) - 1)] for p in parts]
        text = "".join(h.text + sep for h, sep in zip(chosen, separators, strict=True)).strip()
        hypotheses.append(
            TranslationHypothesis(
                text=text,
                score=_weighted_score(chosen),
                tokens=[token for h in chosen for token in h.tokens],
                alignment=_block_diagonal(chosen, [len(p.source_tokens) for p in parts]),
            )
        )
    source_tokens = [token for p in parts for token in p.source_tokens]
    return SentenceTranslation(sentence.text, sentence.span, len(parts), hypotheses, source_tokens)


def _weighted_score(hypotheses: Sequence[TranslationHypothesis]) -> float:
    if not hypotheses:
        return 0.0
    weights = [max(1, len(h.tokens)) for h in hypotheses]
    return sum(h.score * w for h, w in zip(hypotheses, weights, strict=True)) / sum(weights)


def _block_diagonal(
    hypotheses: Sequence[TranslationHypothesis], source_lengths: Sequence[int]
) -> list[list[float]] | None:
    """Each piece's (target × its source) attention placed on the diagonal of the whole."""
    if any(h.alignment is None for h in hypotheses):
        return None
    width = sum(source_lengths)
    rows: list[list[float]] = []
    offset = 0
    for h, n_source in zip(hypotheses, source_lengths, strict=True):
        assert h.alignment is not None
        rows += [[0.0] * offset + row[:n_source] + [0.0] * (width - offset - n_source) for row in h.alignment]
        offset += n_source
    return rows
