"""Verifying a rerank artefact through the service's own engine, against its source.

Every variant is staged with a manifest and loaded with ``service.engine.loader.load_engine``;
its logits come from ``OnnxReranker.rerank`` (the served tokenizer copy, pair truncation, the
engine's length-sorted sub-batches) and are compared with Hugging Face's
``AutoModelForSequenceClassification`` fed by the source's own tokenizer (``truncation=True``):

* fp32: logits max-abs error ≤ 1e-4 on check pairs (every check sentence as a document of a few
  queries, an empty one and one far beyond the maximum length among them), and every query's
  documents in the same order as Hugging Face's wherever its logits are further apart than that;
* int8/fp16: the Pearson correlation of their logits with fp32's ≥ 0.99 (the embedders' int8
  check is a mean cosine ≥ 0.99 to fp32: the same "follows fp32" bar for a score);
* every variant: the reference sentences as pairs (each with the next) scored alone vs inside
  mixed batches, and int8/fp16 against fp32 on them, written into ``Manifest.reference_check``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from export.progress import progress
from export.verify import Parity, VerificationError, load_staged
from export.verify.determinism import mixed_batches
from export.verify.embedding import CHECK_SENTENCES
from export.verify.reference_set import ReferenceSet
from service.artefacts import ReferenceCheck, Variant
from service.engine.loader import load_engine
from service.engine.session import SessionConfig

if TYPE_CHECKING:
    from export.sources.cross_encoder import CrossEncoderSource
    from service.engine.reranker import OnnxReranker

CHECK_QUERIES = CHECK_SENTENCES[:3]
MAX_ALONE_VS_BATCHED = 1e-4  # logits of a pair alone vs inside a mixed batch (fp32, int8)


@dataclass(frozen=True)
class Tolerances:
    max_abs_logits: float = 1e-4
    min_pearson_vs_fp32: float = 0.99


DEFAULT_TOLERANCES = Tolerances()

Pairs = list[tuple[str, str]]


def check_pairs() -> Pairs:
    """Every check sentence (empty and over-long ones included) as a document of each query."""
    return [(q, d) for q in CHECK_QUERIES for d in CHECK_SENTENCES]


def reference_pairs(reference: ReferenceSet) -> Pairs:
    sentences = reference.sentences
    return [(s, sentences[(i + 1) % len(sentences)]) for i, s in enumerate(sentences)]


def open_engine(directory: Path, threads: int) -> OnnxReranker:
    """The staged artefact as the service loads it (CPU, sha256-verified)."""
    from service.engine.reranker import OnnxReranker

    engine = load_engine(directory, SessionConfig("cpu", threads, allow_spinning=False))
    if not isinstance(engine, OnnxReranker):
        raise VerificationError(f"{directory}: not a rerank artefact")
    return engine


def logits(engine: OnnxReranker, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """The engine's logits of ``pairs`` (one call: the engine sub-batches by length)."""
    from service.engine.reranker import RerankItem

    out = []
    for (query, document), result in zip(
        pairs, engine.rerank([RerankItem(q, d) for q, d in pairs]), strict=True
    ):
        if isinstance(result, Exception):
            raise VerificationError(f"the engine failed on {(query, document)!r}: {result}") from result
        out.append(result.logit)
    return np.asarray(out, dtype=np.float64)


def hugging_face_logits(source: CrossEncoderSource, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """The source in its own framework: its tokenizer (``truncation=True``: longest-first) and
    ``AutoModelForSequenceClassification``, in batches of 16."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(source.directory)).float().eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(pairs), 16):
            queries, documents = zip(*pairs[start : start + 16], strict=True)
            inputs = tokenizer(
                list(queries),
                list(documents),
                padding=True,
                truncation=True,
                max_length=source.encoder.max_len,
                return_tensors="pt",
            )
            # the inputs the model takes (a tokenizer may offer token type ids it has no use for)
            taken = {k: v for k, v in inputs.items() if k in source.input_names}
            out.append(model(**taken).logits[:, 0].double().numpy())
    return np.concatenate(out)


def misordered(ours: np.ndarray, reference: np.ndarray, groups: int, apart: float) -> int:
    """Pairs of documents of one query ranked the other way round than ``reference`` ranks them,
    among those whose reference logits are more than ``apart`` apart (closer ones may swap)."""
    count = 0
    for a, b in zip(np.split(ours, groups), np.split(reference, groups), strict=True):
        ref_diff = b[:, None] - b[None, :]
        flipped = np.sign(a[:, None] - a[None, :]) != np.sign(ref_diff)
        count += int((flipped & (np.abs(ref_diff) > apart)).sum()) // 2
    return count


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def alone_vs_batched(engine: OnnxReranker, pairs: Pairs) -> tuple[np.ndarray, float]:
    """The logits of ``pairs`` scored in mixed batches, and their largest difference to each
    pair scored alone (export/verify/determinism.py's batches)."""
    alone = np.concatenate([logits(engine, [p]) for p in pairs])
    batched = np.zeros(len(pairs))
    for batch in mixed_batches(len(pairs)):
        batched[batch] = logits(engine, [pairs[i] for i in batch])
    return batched, float(np.abs(alone - batched).max())


class RerankVerifier:
    """The Hugging Face logits of one source, computed once; ``verify`` checks one staged variant."""

    def __init__(
        self,
        source: CrossEncoderSource,
        reference_set: ReferenceSet,
        tolerances: Tolerances,
        threads: int,
        name: str,
    ) -> None:
        self.source, self.reference_set, self.tolerances = source, reference_set, tolerances
        self.threads, self.name = threads, name
        self.pairs = check_pairs()
        self.reference_pairs = reference_pairs(reference_set)
        progress(f"{name}: scoring {len(self.pairs)} check pairs with Hugging Face's model")
        self.expected = hugging_face_logits(source, self.pairs)
        self.fp32: tuple[np.ndarray, np.ndarray] | None = None  # check and reference logits

    def verify(self, variant: Variant, directory: Path) -> tuple[Parity, ReferenceCheck]:
        """Load the staged ``directory`` as the service does and check it; return the parity
        figures and the reference check, raise VerificationError when out of tolerance."""
        started = time.perf_counter()
        engine = load_staged(open_engine, directory, self.threads, f"{self.name}/{variant}")
        ours = logits(engine, self.pairs)
        groups = len(CHECK_QUERIES)
        parity = {
            "max_abs_logits": float(np.abs(ours - self.expected).max()),
            "misordered_vs_hf": float(
                misordered(ours, self.expected, groups, self.tolerances.max_abs_logits)
            ),
            "n_check_pairs": float(len(self.pairs)),
        }
        batched, spread = alone_vs_batched(engine, self.reference_pairs)
        figures = {"alone_vs_batched_max_abs_logits": spread}
        bounds = {"max_alone_vs_batched_max_abs_logits": MAX_ALONE_VS_BATCHED} if variant != "fp16" else {}
        failures = []
        if variant != "fp16" and spread > MAX_ALONE_VS_BATCHED:
            failures.append(f"alone vs batched max-abs logits {spread:.3g} > {MAX_ALONE_VS_BATCHED:g}")
        if variant == "fp32":
            self.fp32 = (ours, batched)
            failures += self._fp32_failures(parity)
        else:
            failures += self._vs_fp32(ours, batched, parity, figures, bounds)
        check = ReferenceCheck(
            reference=self.reference_set.path,
            sha256=self.reference_set.sha256,
            sentences=len(self.reference_set.sentences),
            figures={k: round(v, 8) for k, v in figures.items()},
            bounds=bounds,
        )
        shown = ", ".join(f"{k}={v:.6g}" for k, v in parity.items() if k != "n_check_pairs")
        progress(f"  {variant}: {shown} ({time.perf_counter() - started:.1f} s)")
        progress(f"  {variant}: reference check {check.figures}")
        if failures:
            raise VerificationError(f"{self.name}/{variant} out of tolerance: " + "; ".join(failures))
        return parity, check

    def _fp32_failures(self, parity: Parity) -> list[str]:
        t, failures = self.tolerances, []
        if not parity["max_abs_logits"] <= t.max_abs_logits:
            failures.append(f"max-abs logits {parity['max_abs_logits']:.3g} > {t.max_abs_logits:g}")
        if parity["misordered_vs_hf"]:
            failures.append(f"{parity['misordered_vs_hf']:g} document pairs ordered unlike Hugging Face")
        return failures

    def _vs_fp32(
        self,
        ours: np.ndarray,
        batched: np.ndarray,
        parity: Parity,
        figures: dict[str, float],
        bounds: dict[str, float],
    ) -> list[str]:
        if self.fp32 is None:
            raise RuntimeError("verify fp32 before the variants derived from it")
        check_fp32, reference_fp32 = self.fp32
        low = self.tolerances.min_pearson_vs_fp32
        parity |= {
            "pearson_vs_fp32": pearson(ours, check_fp32),
            "max_abs_logits_vs_fp32": float(np.abs(ours - check_fp32).max()),
        }
        figures |= {
            "pearson_vs_fp32": pearson(batched, reference_fp32),
            "max_abs_logits_vs_fp32": float(np.abs(batched - reference_fp32).max()),
        }
        bounds["min_pearson_vs_fp32"] = low
        return [
            f"{where} Pearson vs fp32 {value:.5f} < {low}"
            for where, value in (
                ("check pairs", parity["pearson_vs_fp32"]),
                ("reference", figures["pearson_vs_fp32"]),
            )
            if not value >= low
        ]
