"""The reference-set bounds (export/verify/reference_set.py) and the manifest field that carries them."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from export.verify.determinism import BeamOutputs, EmbeddingDeterminism, TranslationDeterminism
from export.verify.reference_set import (
    MIN_CHRF_VS_FP32,
    MIN_COSINE_VS_FP32,
    REFERENCE_FILE,
    embedding_check,
    load_reference,
    reference_for,
    translation_check,
)
from service.artefacts import Manifest
from tests.service.small_engines import HashEmbedder

REFERENCE = load_reference()
TEXTS = ["ein Hund läuft im Schnee", "zwei Kinder spielen am Strand", "eine Frau liest ein Buch"]


def _run(batched: list[str], alone: list[str] | None = None) -> TranslationDeterminism:
    pieces = [t.split() for t in batched]
    report = TranslationDeterminism(sentences=len(batched))
    for beam in (1, 4):
        alone_pieces = [t.split() for t in (alone or batched)]
        report.beams[beam] = BeamOutputs(beam, alone_pieces, pieces, list(batched))
    return report


def test_reference_file_is_committed_and_hashed() -> None:
    assert REFERENCE.path == "export/reference/sentences.en.txt"
    assert REFERENCE.sha256 == hashlib.sha256(REFERENCE_FILE.read_bytes()).hexdigest()
    assert len(REFERENCE.sentences) >= 200 and all(s == s.strip() and s for s in REFERENCE.sentences)


def test_each_source_language_has_its_own_sentences_and_others_fall_back_to_english() -> None:
    german = load_reference(reference_for("de"))
    assert german.path == "export/reference/sentences.de.txt"
    assert len(german.sentences) == len(REFERENCE.sentences)  # written line by line to match
    assert not set(german.sentences) & set(REFERENCE.sentences)  # not the English copied
    assert sum("ä" in s or "ö" in s or "ü" in s or "ß" in s for s in german.sentences) > 30
    assert reference_for("en") == REFERENCE_FILE and reference_for("fr") == REFERENCE_FILE


def test_translation_bounds() -> None:
    fp32 = _run(TEXTS)
    check, failures = translation_check(REFERENCE, _run(TEXTS), fp32)
    assert failures == []
    assert check.figures["chrf_vs_fp32_beam4"] == 100.0 and check.figures["identical_to_fp32_beam4"] == 1.0
    assert check.bounds == {
        "min_alone_vs_batched_identical_beam1": 1.0,
        "min_alone_vs_batched_identical_beam4": 1.0,
        "min_chrf_vs_fp32_beam4": MIN_CHRF_VS_FP32,
    }
    assert check.sha256 == REFERENCE.sha256 and check.sentences == len(REFERENCE.sentences)

    drifted = _run(["ein Hund", "Kinder", "eine Frau liest"], alone=["ein Hund", "Kinder", "eine Frau"])
    check, failures = translation_check(REFERENCE, drifted, fp32)
    assert check.figures["alone_vs_batched_identical_beam4"] == round(2 / 3, 8)
    assert any("alone vs batched" in f and "1/3 differ" in f for f in failures)
    assert any(f.startswith("chrF vs fp32") for f in failures)


def test_fp16_records_alone_vs_batched_without_a_bound() -> None:
    drifted = _run(TEXTS, alone=[*TEXTS[:2], "eine Frau"])
    check, failures = translation_check(REFERENCE, drifted, _run(TEXTS), bound_determinism=False)
    assert failures == [] and "min_alone_vs_batched_identical_beam4" not in check.bounds
    assert check.figures["alone_vs_batched_identical_beam4"] == round(2 / 3, 8)


def test_embedding_bounds() -> None:
    rng = np.random.default_rng(0)
    fp32 = rng.normal(size=(6, 8)).astype(np.float32)
    same = EmbeddingDeterminism(alone=fp32, batched=fp32)
    check, failures = embedding_check(REFERENCE, same, same)
    assert failures == [] and check.figures["min_cosine_vs_fp32"] > 0.99999
    assert check.bounds["min_min_cosine_vs_fp32"] == MIN_COSINE_VS_FP32

    noisy = fp32 + rng.normal(scale=1.0, size=fp32.shape).astype(np.float32)
    check, failures = embedding_check(REFERENCE, EmbeddingDeterminism(alone=fp32, batched=noisy), same)
    assert check.figures["alone_vs_batched_min_cosine"] < 0.99
    assert {f.split(" ")[0] for f in failures} == {"alone", "mean", "min"}


def test_manifests_without_a_reference_check_still_load() -> None:
    """Artefacts exported before the field existed stay servable (the export re-measures them)."""
    manifest = HashEmbedder().manifest
    on_disk = json.loads(manifest.model_dump_json())
    assert on_disk.pop("reference_check") is None
    assert Manifest.model_validate(on_disk).reference_check is None
