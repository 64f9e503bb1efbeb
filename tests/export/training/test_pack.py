"""Packing runs into small fp16 parts and joining them back into fp32 checkpoints the export reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from export.sources.ours.checkpoint import load_checkpoint, load_state, read_config, save_checkpoint
from export.sources.ours.model import Transformer, TransformerConfig
from export.training.pack import join, main, pack
from export.translation import export_translation
from service.artefacts import load_and_verify
from tests.tiny_models import few_reference_sentences

CFG = TransformerConfig(
    vocab_size=300, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=2, n_decoder_layers=1, max_len=16
)


def run_with_half_representable_weights(run: Path, seed: int) -> dict[str, torch.Tensor]:
    """A work directory whose best checkpoint's weights are exact in fp16 (so the round trip is exact)."""
    torch.manual_seed(seed)
    model = Transformer(CFG)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.copy_(tensor.half().float())
    save_checkpoint(model, run / "best.safetensors")
    (run / "tokenizer.json").write_text('{"not": "read by pack"}')
    (run / "history.json").write_text(json.dumps([{"epoch": 1, "val_bleu_greedy": 1.0}]))
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_round_trip_is_exact_for_fp16_weights_and_parts_stay_small(tmp_path: Path) -> None:
    """Two runs in parts below the limit (several of them); joined, each run's checkpoint is fp32 with
    the same config and exactly the same weights, beside its tokenizer and history."""
    weights = {}
    for name, seed in (("a", 0), ("b", 1)):
        (tmp_path / name).mkdir()
        weights[name] = run_with_half_representable_weights(tmp_path / name, seed)
    part_mib = 0.05
    manifest = json.loads(
        pack([tmp_path / "a", tmp_path / "b"], tmp_path / "out", part_mib=part_mib).read_text()
    )
    parts = sorted((tmp_path / "out").glob("pack.part-*"))
    assert len(parts) == len(manifest["parts"]) > 2
    assert all(p.stat().st_size <= part_mib * 2**20 for p in parts)
    assert [r["run"] for r in manifest["runs"]] == ["a", "b"]
    assert manifest["runs"][0]["checkpoint"] == "best.safetensors"

    runs = join(tmp_path / "out", tmp_path / "back")
    assert runs == [tmp_path / "back" / "a", tmp_path / "back" / "b"]
    for run in runs:
        assert read_config(run / "model.safetensors") == CFG
        state = load_state(run / "model.safetensors")
        assert state.keys() == weights[run.name].keys()
        for k, v in weights[run.name].items():
            assert state[k].dtype == torch.float32 and torch.equal(state[k], v), k
        assert (run / "tokenizer.json").read_text() == (tmp_path / run.name / "tokenizer.json").read_text()
        assert (run / "history.json").exists()


def test_an_altered_or_missing_part_is_refused(tmp_path: Path) -> None:
    """join checks every part against pack.json before unpacking anything."""
    (tmp_path / "a").mkdir()
    run_with_half_representable_weights(tmp_path / "a", 0)
    pack([tmp_path / "a"], tmp_path / "out", part_mib=0.05)
    part = tmp_path / "out" / "pack.part-02"
    data = bytearray(part.read_bytes())
    data[10] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"pack\.part-02: sha256"):
        join(tmp_path / "out", tmp_path / "back")
    part.unlink()
    with pytest.raises(FileNotFoundError):
        join(tmp_path / "out", tmp_path / "back")


def test_the_joined_checkpoint_exports(translation_checkpoint: Path, tmp_path: Path) -> None:
    """A trained tiny run (the averaged checkpoint preferred over best: the run's tiny checkpoint,
    tests/conftest.py) packed with the CLI and joined back exports to a verified fp32 artefact
    with its name."""
    trained = translation_checkpoint
    run = tmp_path / "tiny-en-de"
    run.mkdir()
    shutil.copy(trained / "tokenizer.json", run)
    shutil.copy(trained / "model.safetensors", run / "averaged.safetensors")
    save_checkpoint(Transformer(load_checkpoint(trained / "model.safetensors").cfg), run / "best.safetensors")
    main([str(run), "--out", str(tmp_path / "out")])
    main(["--join", str(tmp_path / "out"), "--to", str(tmp_path / "back")])
    reference = few_reference_sentences(tmp_path / "reference.txt")
    (directory,) = export_translation(
        tmp_path / "back" / "tiny-en-de", tmp_path / "artefacts", ["fp32"], reference=reference
    )
    assert load_and_verify(directory).name == "tiny-en-de"
    back, original = (
        load_state(tmp_path / "back" / "tiny-en-de" / "model.safetensors"),
        load_state(trained / "model.safetensors"),
    )
    for k, v in original.items():
        torch.testing.assert_close(back[k], v, atol=1e-2, rtol=1e-3)
