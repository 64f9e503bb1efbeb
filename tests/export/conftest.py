"""The tiny reversal model of the translation export tests, trained once per run for
test_translation_export.py and test_translation_re_export.py and exported once for the first
(tests/background.py: built_once), whichever pytest-xdist worker runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.background import built_once


@pytest.fixture(scope="session")
def reversal_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``transformer-en-de/model.safetensors`` + tokenizer.json, trained 40 steps on reversal."""
    from tests.tiny_models import tiny_translation_checkpoint

    def train(folder: Path) -> Path:
        return tiny_translation_checkpoint(
            folder / "transformer-en-de",
            max_len=48,
            vocab_size=80,
            n_heads=4,
            n_encoder_layers=2,
            n_decoder_layers=2,
        )

    return built_once(tmp_path_factory, "reversal-checkpoint", train)


@pytest.fixture(scope="session")
def reversal_export(reversal_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The artefact root of its fp32 + int8 export, given a few validation and test lines so that
    the export's greedy-on-val and BLEU checks run too. Tests copy it before they change it."""
    from export.translation import export_translation
    from tests.tiny_models import reversal_pairs

    def export(folder: Path) -> Path:
        eval_dir = folder / "eval"
        eval_dir.mkdir()
        sources, targets = reversal_pairs(12)
        (eval_dir / "val.en").write_text("\n".join(sources[:6]) + "\n", encoding="utf-8")
        (eval_dir / "test_2016_flickr.en").write_text("\n".join(sources[6:]) + "\n", encoding="utf-8")
        (eval_dir / "test_2016_flickr.de").write_text("\n".join(targets[6:]) + "\n", encoding="utf-8")
        out = folder / "artefacts"
        dirs = export_translation(reversal_checkpoint, out, ["fp32", "int8"], eval_dir=eval_dir)
        assert dirs == [out / "transformer-en-de" / "fp32", out / "transformer-en-de" / "int8"]
        return out

    return built_once(tmp_path_factory, "reversal-export", export)
