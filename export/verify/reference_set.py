"""The reference sentences every published variant is measured on, and the bounds it must meet.

``export/reference/sentences.<language>.txt`` hold a few hundred short sentences written for
this project (caption-like and general; not taken from any test set): English, and German
written line by line to match; a translation model is measured on the file of its source
language (English when there is none), an embedding model on English. So every export —
also the auto-export of ``make serve`` and the Docker builds, which have no ``--eval-dir`` —
measures each variant and writes the figures into its manifest (``Manifest.reference_check``):

* alone vs batched (export/verify/determinism.py): translations token-identical at beam 1 and 4,
  embeddings cosine ≥ ``MIN_EMBED_COSINE``; a bound for fp32 and int8. fp16 records the figure
  without a bound: it is the GPU variant, and on the CPU provider (all the export has) part of
  it runs through inserted float32 casts, so its CPU figure says little about the GPU (measured:
  1 of 290 transformer-en-de beam-4 translations differed on CPU);
* int8 / fp16 against the fp32 artefact, through the same engine: translation chrF of the
  variant's beam-4 output with fp32's as the reference (``MIN_CHRF_VS_FP32``), embeddings
  mean / min cosine to fp32 (``MIN_MEAN_COSINE_VS_FP32`` / ``MIN_COSINE_VS_FP32``).

Translations stop at each sentence's own output limit, as the service caps them
(``export.sources.ours.data.OUTPUT_LIMIT_RULE``, recorded as ``ReferenceCheck.output_limit``): a model with
random weights never emits </s> and would otherwise decode every sentence to its maximum length.

A variant beyond a bound fails its export (``VerificationError``, nothing published). The bounds
were set from the default models' measured figures with a margin (README, "Bring your own
model"): per-row int8 of transformer-en-de gives chrF ≈ 9x vs fp32, of all-MiniLM-L6-v2 a mean
cosine ≈ 0.996.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export.verify.determinism import MIN_EMBED_COSINE, EmbeddingDeterminism, TranslationDeterminism, cosines
from service.artefacts import ReferenceCheck, sha256_of

EXPORT_DIR = Path(__file__).resolve().parents[1]
REFERENCE_DIR = EXPORT_DIR / "reference"  # package data beside the stages, as export/checkpoints
REFERENCE_FILE = REFERENCE_DIR / "sentences.en.txt"
MIN_CHRF_VS_FP32 = 90.0  # chrF (0-100) of int8/fp16 beam-4 output against fp32's
MIN_MEAN_COSINE_VS_FP32 = 0.99
MIN_COSINE_VS_FP32 = 0.95
QUALITY_BEAM = 4


@dataclass(frozen=True)
class ReferenceSet:
    sentences: list[str]
    sha256: str
    path: str


def reference_for(language: str) -> Path:
    """The committed sentences in ``language`` (``sentences.<language>.txt``), else English."""
    path = REFERENCE_DIR / f"sentences.{language}.txt"
    return path if path.is_file() else REFERENCE_FILE


def load_reference(path: Path = REFERENCE_FILE) -> ReferenceSet:
    """The non-blank lines of the reference file, and the file's sha256; ValueError if none."""
    text = path.read_text(encoding="utf-8")
    sentences = [line.strip() for line in text.splitlines() if line.strip()]
    if not sentences:
        raise ValueError(f"{path}: no reference sentences (one per line expected)")
    try:
        shown = path.relative_to(EXPORT_DIR.parent).as_posix()
    except ValueError:  # a reference file outside the repository (tests)
        shown = str(path)
    return ReferenceSet(sentences, sha256_of(path), shown)


def chrf(hypotheses: list[str], references: list[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_chrf(hypotheses, [references]).score)


def translation_check(
    reference: ReferenceSet,
    determinism: TranslationDeterminism,
    fp32: TranslationDeterminism | None,
    bound_determinism: bool = True,
    output_limit: str | None = None,
) -> tuple[ReferenceCheck, list[str]]:
    """The manifest's figures for one translation variant and the bounds it failed (if any).

    ``fp32`` is the fp32 artefact's run on the same sentences (None for fp32 itself);
    ``bound_determinism`` False records alone-vs-batched without bounding it (fp16);
    ``output_limit`` states how each sentence's output was capped."""
    figures = determinism.figures()
    bounds = {f"min_{k}": 1.0 for k in figures} if bound_determinism else {}
    failures = []
    if bound_determinism and not determinism.ok:
        failures.append(f"alone vs batched: {determinism.describe(reference.sentences)}")
    if fp32 is not None:
        mine, base = determinism.beams[QUALITY_BEAM], fp32.beams[QUALITY_BEAM]
        score = chrf(mine.batched_texts, base.batched_texts)
        same = sum(a == b for a, b in zip(mine.batched, base.batched, strict=True)) / max(
            len(mine.batched), 1
        )
        figures |= {"chrf_vs_fp32_beam4": score, "identical_to_fp32_beam4": same}
        bounds["min_chrf_vs_fp32_beam4"] = MIN_CHRF_VS_FP32
        if score < MIN_CHRF_VS_FP32:
            failures.append(f"chrF vs fp32 {score:.2f} < {MIN_CHRF_VS_FP32}")
    return _check(reference, figures, bounds, output_limit), failures


def embedding_check(
    reference: ReferenceSet,
    determinism: EmbeddingDeterminism,
    fp32: EmbeddingDeterminism | None,
    bound_determinism: bool = True,
) -> tuple[ReferenceCheck, list[str]]:
    """As :func:`translation_check`, for an embedding variant (cosines of the batched vectors)."""
    figures = determinism.figures()
    bounds = {"min_alone_vs_batched_min_cosine": MIN_EMBED_COSINE} if bound_determinism else {}
    failures = []
    if bound_determinism and not determinism.ok:
        failures.append(f"alone vs batched min cosine {determinism.min_cosine:.7f}")
    if fp32 is not None:
        vs_fp32 = cosines(determinism.batched, fp32.batched)
        mean, low = float(np.mean(vs_fp32)), float(np.min(vs_fp32))
        figures |= {"mean_cosine_vs_fp32": mean, "min_cosine_vs_fp32": low}
        bounds |= {
            "min_mean_cosine_vs_fp32": MIN_MEAN_COSINE_VS_FP32,
            "min_min_cosine_vs_fp32": MIN_COSINE_VS_FP32,
        }
        if mean < MIN_MEAN_COSINE_VS_FP32:
            failures.append(f"mean cosine vs fp32 {mean:.5f} < {MIN_MEAN_COSINE_VS_FP32}")
        if low < MIN_COSINE_VS_FP32:
            failures.append(f"min cosine vs fp32 {low:.5f} < {MIN_COSINE_VS_FP32}")
    return _check(reference, figures, bounds), failures


def _check(
    reference: ReferenceSet,
    figures: dict[str, float],
    bounds: dict[str, float],
    output_limit: str | None = None,
) -> ReferenceCheck:
    return ReferenceCheck(
        reference=reference.path,
        sha256=reference.sha256,
        sentences=len(reference.sentences),
        figures={k: round(float(v), 8) for k, v in figures.items()},
        bounds=bounds,
        output_limit=output_limit,
    )
