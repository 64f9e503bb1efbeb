"""``python -m export.training.distill``: the training corpus with a teacher's (or an ensemble's)
translations as targets, ready for ``python -m export.training.train``."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.translate import translate
from export.training.distill import main
from tests.tiny_models import reversal_pairs, tiny_translation_checkpoint


@pytest.fixture(scope="module")
def teachers(translation_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two tiny checkpoints of one vocabulary (the tokenizer is trained on the same corpus): the
    run's (tests/conftest.py, seed 0) and one of seed 1."""
    root = tmp_path_factory.mktemp("teachers")
    return [
        translation_checkpoint / "model.safetensors",
        tiny_translation_checkpoint(root / "t1", seed=1) / "model.safetensors",
    ]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("data")
    for split, n, seed in (("train", 9, 3), ("val", 4, 4)):
        sources, targets = reversal_pairs(n, seed)
        (d / f"{split}.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
        (d / f"{split}.de").write_text("\n".join(targets) + "\n", encoding="utf-8")
    return d


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_the_targets_are_the_ensembles_translations(
    teachers: list[Path], data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "kd"
    main(["--data-dir", str(data_dir), "--out", str(out), "--beam", "2", "--length-penalty", "1.0"]
         + [arg for t in teachers for arg in ("--teacher", str(t))])  # fmt: skip
    sources = (data_dir / "train.en").read_text(encoding="utf-8").splitlines()
    tokenizer = Tokenizer.from_file(str(teachers[0].parent / "tokenizer.json"))
    models = [load_checkpoint(t) for t in teachers]
    assert read(out / "train.en.gz") == sources
    assert read(out / "train.de.gz") == translate(models, tokenizer, sources, beam_size=2, length_penalty=1.0)
    for lang in ("en", "de"):  # selection stays on the real references
        assert (out / f"val.{lang}").read_bytes() == (data_dir / f"val.{lang}").read_bytes()


def test_one_teacher(teachers: list[Path], data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "kd"
    main(["--teacher", str(teachers[0]), "--data-dir", str(data_dir), "--out", str(out), "--beam", "1"])
    sources = (data_dir / "train.en").read_text(encoding="utf-8").splitlines()
    tokenizer = Tokenizer.from_file(str(teachers[0].parent / "tokenizer.json"))
    assert read(out / "train.de.gz") == translate(
        load_checkpoint(teachers[0]), tokenizer, sources, beam_size=1
    )
