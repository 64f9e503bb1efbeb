"""safetensors checkpoints: round trip from the file alone, averaging, fp16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.testing import assert_close

from export.sources.ours.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    load_state,
    read_config,
    save_checkpoint,
)
from export.sources.ours.model import Transformer, TransformerConfig

CFG = TransformerConfig(
    vocab_size=50,
    d_model=32,
    n_heads=4,
    d_ff=64,
    n_encoder_layers=2,
    n_decoder_layers=1,
    max_len=40,
    dropout=0.1,
)
SRC = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
TGT = torch.tensor([[1, 11, 12, 13], [1, 14, 15, 2]])


def make(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(CFG).eval()


def test_round_trip_rebuilds_the_same_model_from_the_file_alone(tmp_path: Path) -> None:
    """load_checkpoint restores the config and every weight: identical outputs, eval mode."""
    model = make(0)
    path = tmp_path / "sub" / "model.safetensors"
    save_checkpoint(model, path)
    assert path.exists() and not path.with_suffix(".tmp").exists()
    assert read_config(path) == CFG
    loaded = load_checkpoint(path)
    assert loaded.cfg == CFG and not loaded.training
    with torch.no_grad():
        assert_close(loaded(SRC, TGT), model(SRC, TGT), atol=0, rtol=0)
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
    assert keys == set(model.state_dict())
    assert "embed.weight" in keys and not any(k.split(".")[-1] == "pe" for k in keys)


def test_average_of_two_checkpoints_is_their_mean(tmp_path: Path) -> None:
    """average_checkpoints returns the element-wise mean of every tensor."""
    a, b = make(1), make(2)
    save_checkpoint(a, tmp_path / "a.safetensors")
    save_checkpoint(b, tmp_path / "b.safetensors")
    avg = average_checkpoints([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    sa, sb = a.state_dict(), b.state_dict()
    assert set(avg) == set(sa)
    for k in sa:
        assert_close(avg[k], (sa[k] + sb[k]) / 2, atol=1e-7, rtol=1e-6)
    assert not torch.equal(avg["embed.weight"], sa["embed.weight"])
    make(3).load_state_dict(avg)  # loads back into a model


def test_fp16_checkpoint_loads_back_to_close_outputs(tmp_path: Path) -> None:
    """A float16 file stores half-precision tensors and loads into an fp32 model with close outputs."""
    model = make(4)
    path = tmp_path / "half.safetensors"
    save_checkpoint(model, path, dtype=torch.float16)
    with safe_open(str(path), framework="pt") as f:
        assert f.get_tensor("embed.weight").dtype == torch.float16
    assert all(t.dtype == torch.float32 for t in load_state(path).values())
    loaded = load_checkpoint(path)
    assert next(loaded.parameters()).dtype == torch.float32
    with torch.no_grad():
        got, want = loaded(SRC, TGT), model(SRC, TGT)
    assert_close(got, want, atol=2e-2, rtol=1e-2)
    assert not torch.equal(got, want)


def test_a_foreign_safetensors_file_is_rejected(tmp_path: Path) -> None:
    """Without the config in its metadata a file is not one of our checkpoints."""
    path = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="transformer_config"):
        load_checkpoint(path)
