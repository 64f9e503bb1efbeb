"""The same answer whatever the batch: each sentence alone vs inside mixed-length batches.

Run through the service's own engines (``OnnxTranslator.translate``, ``OnnxEmbedder.embed``),
so what is checked is what serves traffic: the padding of a batch to its longest source, the
beam search's rows of other sentences, sub-batching. The export calls these on the reference
sentences for every variant and fails beyond the bounds below; the tests call them on the tiny
models. No torch here: the checks need only an engine.

Batches are the sentences in a fixed pseudo-random order, cut into batches of cycling sizes
(``BATCH_SIZES``), so every batch mixes short and long sentences and the row count varies.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from service.engine.base import (
    Embedding,
    EmbedEngine,
    EmbedItem,
    TranslateEngine,
    TranslateItem,
    TranslateOptions,
    Translation,
)

BEAM_SIZES = (1, 4)  # greedy and the service's default beam
BATCH_SIZES = (32, 7, 16)  # cycled: several row counts, each batch of mixed lengths
MIN_EMBED_COSINE = 0.99999  # alone vs batched, every sentence


class DeterminismError(RuntimeError):
    """An engine call failed for a sentence during the check (the message names it)."""


def mixed_batches(n: int, sizes: Sequence[int] = BATCH_SIZES, seed: int = 0) -> list[list[int]]:
    """Indices 0..n-1 shuffled with ``seed`` and cut into batches of cycling ``sizes``."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    batches: list[list[int]] = []
    start = 0
    while start < n:
        size = sizes[len(batches) % len(sizes)]
        batches.append(order[start : start + size])
        start += size
    return batches


@dataclass(frozen=True)
class BeamOutputs:
    """Best hypotheses of every sentence, translated alone and batched, at one beam size."""

    beam_size: int
    alone: list[list[str]]  # subword pieces
    batched: list[list[str]]
    batched_texts: list[str]

    @property
    def differing(self) -> list[int]:
        return [i for i, (a, b) in enumerate(zip(self.alone, self.batched, strict=True)) if a != b]


@dataclass(frozen=True)
class TranslationDeterminism:
    sentences: int
    beams: dict[int, BeamOutputs] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(b.differing for b in self.beams.values())

    def figures(self) -> dict[str, float]:
        """Fraction of sentences identical alone vs batched, per beam size (1.0: all)."""
        return {
            f"alone_vs_batched_identical_beam{beam}": 1.0 - len(out.differing) / max(self.sentences, 1)
            for beam, out in self.beams.items()
        }

    def describe(self, texts: Sequence[str]) -> str:
        parts = []
        for beam, out in self.beams.items():
            if out.differing:
                shown = "; ".join(repr(texts[i]) for i in out.differing[:3])
                parts.append(f"beam {beam}: {len(out.differing)}/{self.sentences} differ (e.g. {shown})")
        return ", ".join(parts) or "identical"


def _best(result: Translation | Exception, text: str) -> Translation:
    if isinstance(result, Exception):
        raise DeterminismError(f"translating {text!r} failed: {result}") from result
    return result


def translation_determinism(
    engine: TranslateEngine,
    texts: Sequence[str],
    beam_sizes: Sequence[int] = BEAM_SIZES,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    seed: int = 0,
    max_lengths: Sequence[int] | None = None,
) -> TranslationDeterminism:
    """Translate every text alone and inside mixed-length batches; compare the best tokens.

    ``max_lengths`` caps each text's output (alone and batched alike; default: the engine's)."""
    report = TranslationDeterminism(sentences=len(texts))
    batches = mixed_batches(len(texts), batch_sizes, seed)
    for beam in beam_sizes:
        if max_lengths is None:
            options = [TranslateOptions(beam_size=beam)] * len(texts)
        else:
            options = [TranslateOptions(beam_size=beam, max_length=n) for n in max_lengths]
        alone = [
            _best(engine.translate([TranslateItem(t, o)])[0], t) for t, o in zip(texts, options, strict=True)
        ]
        batched: list[Translation | None] = [None] * len(texts)
        for batch in batches:
            results = engine.translate([TranslateItem(texts[i], options[i]) for i in batch])
            for i, result in zip(batch, results, strict=True):
                batched[i] = _best(result, texts[i])
        done = [b for b in batched if b is not None]
        report.beams[beam] = BeamOutputs(
            beam_size=beam,
            alone=[a.hypotheses[0].tokens for a in alone],
            batched=[b.hypotheses[0].tokens for b in done],
            batched_texts=[b.hypotheses[0].text for b in done],
        )
    return report


@dataclass(frozen=True)
class EmbeddingDeterminism:
    alone: np.ndarray  # (n, dim) float32, un-normalised as the engine returns them
    batched: np.ndarray

    @property
    def cosines(self) -> np.ndarray:
        return cosines(self.alone, self.batched)

    @property
    def min_cosine(self) -> float:
        return float(self.cosines.min()) if len(self.alone) else 1.0

    @property
    def ok(self) -> bool:
        return self.min_cosine >= MIN_EMBED_COSINE

    def figures(self) -> dict[str, float]:
        return {"alone_vs_batched_min_cosine": self.min_cosine}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity, in float64."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.maximum(np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1), 1e-30)
    return np.asarray((a64 * b64).sum(axis=1) / norms)


def _vector(result: Embedding | Exception, text: str) -> np.ndarray:
    if isinstance(result, Exception):
        raise DeterminismError(f"embedding {text!r} failed: {result}") from result
    return np.asarray(result.vector, dtype=np.float32)


def embedding_determinism(
    engine: EmbedEngine,
    texts: Sequence[str],
    batch_sizes: Sequence[int] = BATCH_SIZES,
    seed: int = 0,
) -> EmbeddingDeterminism:
    """Embed every text alone and inside mixed-length batches."""
    alone = [_vector(engine.embed([EmbedItem(t)])[0], t) for t in texts]
    batched: list[np.ndarray | None] = [None] * len(texts)
    for batch in mixed_batches(len(texts), batch_sizes, seed):
        for i, result in zip(batch, engine.embed([EmbedItem(texts[i]) for i in batch]), strict=True):
            batched[i] = _vector(result, texts[i])
    return EmbeddingDeterminism(
        alone=np.stack(alone), batched=np.stack([b for b in batched if b is not None])
    )
