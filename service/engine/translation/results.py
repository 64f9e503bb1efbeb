"""The post stage of translation: a sentence's hypotheses as the engine's ``Translation`` (n-best
texts, scores, token pieces and alignments)."""

from __future__ import annotations

from service.engine.base import Translation, TranslationHypothesis
from service.engine.tokenizer import Encoded, TextTokenizer
from service.engine.translation.sentence_search import TokenHypothesis


def to_translation(
    tokenizer: TextTokenizer, source: Encoded, found: list[TokenHypothesis], limit: int, with_alignment: bool
) -> Translation:
    """n-best texts, scores, pieces and alignments; cut to ``limit`` tokens (a no-op safeguard:
    the search already stops each sentence at its own limit)."""
    cut = [h.tokens[:limit] for h in found]
    texts = tokenizer.decode_batch(cut)
    hypotheses = [
        TranslationHypothesis(
            text=text,
            score=float(h.score),
            tokens=tokenizer.id_to_tokens(tokens),
            alignment=_alignment(h, len(tokens), source.n_tokens) if with_alignment else None,
        )
        for h, tokens, text in zip(found, cut, texts, strict=True)
    ]
    return Translation(
        hypotheses=hypotheses,
        source_tokens=source.tokens,
        n_input_tokens=source.n_tokens,
        n_output_tokens=len(cut[0]) if cut else 0,
    )


def empty_translation(with_alignment: bool) -> Translation:
    """An empty source translates to one empty hypothesis, without running the model."""
    alignment: list[list[float]] | None = [] if with_alignment else None
    hypothesis = TranslationHypothesis(text="", score=0.0, tokens=[], alignment=alignment)
    return Translation(hypotheses=[hypothesis], source_tokens=[], n_input_tokens=0, n_output_tokens=0)


def _alignment(h: TokenHypothesis, n_target: int, n_source: int) -> list[list[float]]:
    """(target tokens, source tokens) cross-attention; the padded source columns dropped."""
    if h.alignment is None:
        return []
    return [[float(x) for x in row[:n_source]] for row in h.alignment[:n_target]]
