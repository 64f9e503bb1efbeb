"""Stage ``terminology`` on a tiny exported model: every required term present, the free search
as the baseline row, BLEU and term accuracy per row."""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import pytest

from benchmarks import terminology
from benchmarks.harness import Bench
from tests.tiny_models import few_reference_sentences, reversal_pairs, tiny_translation_checkpoint


def write_data(folder: Path) -> None:
    m30k = folder / "multi30k"
    m30k.mkdir(parents=True)
    for split, (sources, targets) in (
        ("train", reversal_pairs(400, seed=1)),
        ("test_2016_flickr", reversal_pairs(40, 2)),
    ):
        for lang, lines in (("en", sources), ("de", targets)):
            with gzip.open(m30k / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")


def test_the_stage_requires_each_sentences_terms_and_reports_their_accuracy(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from export.translation import export_translation

    write_data(tmp_path)
    checkpoint = tiny_translation_checkpoint(tmp_path / "ckpt" / "transformer-en-de", max_len=48)
    reference = few_reference_sentences(tmp_path / "reference.txt")
    [artefact] = export_translation(checkpoint, tmp_path / "artefacts", ["int8"], reference=reference)
    args = argparse.Namespace(
        quick=True, threads=1, out=tmp_path / "out", data_dir=tmp_path, duration=None, rounds=1
    )
    bench = Bench(args)
    bench.models["transformer-en-de/int8"] = artefact
    _, sentences = terminology.terminology_set(tmp_path, "en", "de")
    assert sentences and all(s.terms for s in sentences)

    terminology.run(bench)
    rows = {r.system: r for r in bench.results.rows}
    free, constrained = rows[terminology.UNCONSTRAINED], rows[terminology.CONSTRAINED]
    placed = rows[terminology.PLACED]
    assert (
        free.baseline and not constrained.baseline and free.section == constrained.section == placed.section
    )
    for row in (constrained, placed):
        assert row.extra["unsatisfiable"] == 0
        assert row.extra["term_accuracy_pct"] == 100.0
        assert row.extra["terms"] == sum(len(s.terms) for s in sentences[:96])
    assert 0 <= free.extra["bleu"] <= 100 and free.value > 0
    assert any("transformer-de-en not measured" in note for note in bench.results.notes)
    assert any("no noun terms for the unseen set" in note for note in bench.results.notes)  # all lowercase
