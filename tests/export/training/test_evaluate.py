"""``python -m export.training.evaluate``: sacreBLEU of a checkpoint, or of several as an ensemble."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
from tokenizers import Tokenizer

from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.translate import translate
from export.training.evaluate import main
from tests.tiny_models import reversal_pairs, tiny_translation_checkpoint


def test_bleu_of_one_checkpoint_and_of_an_ensemble(
    translation_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's tiny checkpoint (tests/conftest.py, seed 0) alone, then with one of seed 1."""
    ckpts = [
        translation_checkpoint / "model.safetensors",
        tiny_translation_checkpoint(tmp_path / "m1", seed=1) / "model.safetensors",
    ]
    sources, targets = reversal_pairs(6, seed=5)
    (tmp_path / "val.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "val.de").write_text("\n".join(targets) + "\n", encoding="utf-8")
    tokenizer = Tokenizer.from_file(str(ckpts[0].parent / "tokenizer.json"))
    models = [load_checkpoint(c) for c in ckpts]
    for members in (ckpts[:1], ckpts):
        main(["--data-dir", str(tmp_path), "--split", "val", "--beam", "2", "--length-penalty", "1.0",
              "--checkpoint", *map(str, members)])  # fmt: skip
        report = json.loads(capsys.readouterr().out)
        hyps = translate(models[: len(members)], tokenizer, sources, beam_size=2, length_penalty=1.0)
        assert report["checkpoints"] == [str(c) for c in members]
        assert report["bleu"] == round(sacrebleu.BLEU().corpus_score(hyps, [targets]).score, 2)
