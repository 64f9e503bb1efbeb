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
* A plain text's inline elements (a document paragraph's runs) go on its best hypothesis: each
  sentence's by the alignment where one holds less than all of it, an element over several
  sentences from its start in the first to its end in the last (``TextTranslation.placed``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from service.engine.base import Translation, TranslationHypothesis
from service.text.html import RunKind, escape_run, parse_html
from service.text.inline import Element, place
from service.text.inline_html import Block, inline_html
from service.text.segment import segment, split_long


@dataclass(frozen=True)
class Sentence:
    text: str
    span: tuple[int, int] | None  # [start, end) in the input text; None in HTML (decoded text runs)
    pieces: list[tuple[str, str]]  # (piece, separator after it): more than one when over the input
    elements: tuple[Element, ...] = ()  # its inline elements (HTML, runs), over ``text``

    @property
    def aligned(self) -> bool:
        """Whether its elements are placed by the alignment: one holds less than all of it."""
        return any((e.start, e.end) != (0, len(self.text)) for e in self.elements)


# One hypothesis per sentence, and the sentences' translations (their source tokens) → the text
Render = Callable[[Sequence[TranslationHypothesis], Sequence["SentenceTranslation"]], str]
# The same → each of the text's inline elements' [start, end) in the rendered text
Locate = Callable[[Sequence[TranslationHypothesis], Sequence["SentenceTranslation"]], list[tuple[int, int]]]


@dataclass(frozen=True)
class Document:
    sentences: list[Sentence]
    render: Render
    locate: Locate | None = None  # a plain text with inline elements

    @property
    def units(self) -> list[str]:
        return [piece for sentence in self.sentences for piece, _ in sentence.pieces]

    @property
    def aligned_units(self) -> list[bool]:
        """Per unit: whether its translation needs the alignment (``Sentence.aligned``)."""
        return [sentence.aligned for sentence in self.sentences for _ in sentence.pieces]


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
    # a plain text's inline elements' [start, end) in the best hypothesis's text
    placed: list[tuple[int, int]] = field(default_factory=list)


CountTokens = Callable[[str], int]


def plain_document(
    text: str,
    language: str,
    count_tokens: CountTokens,
    max_tokens: int,
    elements: Sequence[Element] = (),
) -> Document:
    """``text``'s sentences; with ``elements`` (over ``text``, parents first), each sentence holds
    those over it and ``Document.locate`` puts them on the translation."""
    segmented = segment(text, language)
    homes = _homes(elements, segmented.spans)
    chosen: list[list[int]] = [[] for _ in segmented.spans]  # per sentence: the elements it holds
    for e, touched in enumerate(homes):
        for i in touched:
            chosen[i].append(e)
    sentences = [
        Sentence(s, span, split_long(s, count_tokens, max_tokens), _clipped(elements, ids, span))
        for s, span, ids in zip(segmented.sentences, segmented.spans, chosen, strict=True)
    ]

    def locate(
        hypotheses: Sequence[TranslationHypothesis], translated: Sequence[SentenceTranslation]
    ) -> list[tuple[int, int]]:
        """Each element's range: from its start in its first sentence to its end in its last."""
        starts, at = [], len(segmented.gaps[0])
        for h, gap in zip(hypotheses, segmented.gaps[1:], strict=True):
            starts.append(at)
            at += len(h.text) + len(gap)
        ranges = [
            dict(zip(ids, _ranges(sentences[i], hypotheses[i], translated[i]), strict=True))
            for i, ids in enumerate(chosen)
        ]
        out = []
        for e, touched in enumerate(homes):
            if not touched:  # no sentence in the text: it comes back as it was
                out.append((elements[e].start, elements[e].end))
                continue
            first, last = touched[0], touched[-1]
            start = starts[first] + ranges[first][e][0]
            out.append((start, max(start, starts[last] + ranges[last][e][1])))
        return out

    return Document(
        sentences,
        lambda hypotheses, _: segmented.join([h.text for h in hypotheses]),
        locate if elements else None,
    )


def html_document(
    text: str, language: str, count_tokens: CountTokens, max_tokens: int, inline: bool = False
) -> Document:
    """Text runs of the HTML (``HtmlError`` when it cannot be kept faithfully), each segmented;
    with ``inline``, the runs that only inline elements separate as one text, the elements put
    back by the alignment (``service/text/inline_html.py``)."""
    layout = inline_html(parse_html(text), inline)
    texts = [u.text if isinstance(u, Block) else layout.document.texts[u] for u in layout.units]
    runs = [segment(t, language) for t in texts]
    sentences: list[Sentence] = []
    chosen: list[list[int]] = []  # per sentence: its block's elements it holds
    for unit, run in zip(layout.units, runs, strict=True):
        homes = _homes(unit.elements, run.spans) if isinstance(unit, Block) else []
        for i, (s, span) in enumerate(zip(run.sentences, run.spans, strict=True)):
            ids = [e for e, touched in enumerate(homes) if i in touched]
            assert isinstance(unit, Block) or not ids
            elements = _clipped(unit.elements, ids, span) if ids and isinstance(unit, Block) else ()
            sentences.append(Sentence(s, None, split_long(s, count_tokens, max_tokens), elements))
            chosen.append(ids)

    def render(hypotheses: Sequence[TranslationHypothesis], translated: Sequence[SentenceTranslation]) -> str:
        out, at = [], 0
        for unit, run in zip(layout.units, runs, strict=True):
            n = len(run.sentences)
            if isinstance(unit, int):
                out.append(run.join([h.text for h in hypotheses[at : at + n]]))
            elif not n and unit.elements:  # no sentence to put them on: the text as it was
                out.append(
                    unit.render(
                        unit.text, [(e.start, e.end) for e in unit.elements], range(len(unit.elements))
                    )
                )
            else:
                parts = [_escaped(run.gaps[0])]
                for j in range(at, at + n):
                    parts.append(_placed(unit, sentences[j], chosen[j], hypotheses[j], translated[j]))
                    parts.append(_escaped(run.gaps[j - at + 1]))
                out.append("".join(parts))
            at += n
        return layout.render(out)

    return Document(sentences, render)


def _homes(elements: Sequence[Element], spans: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Per element: the sentences (at ``spans``, in order) it is put on: those it overlaps, else
    (whitespace or nothing between sentences) the one it follows."""
    starts = [s0 for s0, _ in spans]
    ends = [s1 for _, s1 in spans]
    homes = []
    for e in elements:
        touched = []
        for i in range(bisect_right(ends, e.start), len(spans)):  # the first ending after its start
            if starts[i] >= e.end:
                break
            touched.append(i)
        if not touched and spans:
            touched = [max(bisect_right(starts, e.start) - 1, 0)]
        homes.append(touched)
    return homes


def _clipped(elements: Sequence[Element], ids: list[int], span: tuple[int, int]) -> tuple[Element, ...]:
    """The ``elements`` at ``ids`` over the sentence at ``span`` (parents among them)."""
    s0, s1 = span
    position = {index: i for i, index in enumerate(ids)}
    out = []
    for index in ids:
        e = elements[index]
        start = min(max(e.start - s0, 0), s1 - s0)
        out.append(Element(start, min(max(e.end - s0, start), s1 - s0), position.get(e.parent, -1)))
    return tuple(out)


def _placed(
    block: Block,
    sentence: Sentence,
    ids: list[int],
    h: TranslationHypothesis,
    translated: SentenceTranslation,
) -> str:
    """The sentence's translation, escaped, with its elements where the alignment puts them."""
    if not ids:
        return _escaped(h.text)
    return block.render(h.text, _ranges(sentence, h, translated), ids)


def _ranges(
    sentence: Sentence, h: TranslationHypothesis, translated: SentenceTranslation
) -> list[tuple[int, int]]:
    """Its elements' ranges in ``h``: by the alignment, or all of it when each holds all of it."""
    if sentence.aligned:
        return place(
            sentence.text, sentence.elements, translated.source_tokens, h.text, h.tokens, h.alignment or []
        )
    return [(0, len(h.text))] * len(sentence.elements)


def _escaped(text: str) -> str:
    return escape_run(text, RunKind.TEXT, "")


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
        text = document.render(chosen, sentences)
        hypotheses.append(TextHypothesis(text, _weighted_score(chosen)))
    best = [s.hypotheses[0] for s in sentences]
    return TextTranslation(
        hypotheses=hypotheses,
        sentences=sentences,
        n_input_tokens=sum(t.n_input_tokens for t in translations),
        n_output_tokens=sum(t.n_output_tokens for t in translations),
        placed=document.locate(best, sentences) if document.locate else [],
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
