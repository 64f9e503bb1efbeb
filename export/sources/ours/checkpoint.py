"""Checkpoints as safetensors files whose metadata carries the model config."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from export.sources.ours.model import Transformer, TransformerConfig

CONFIG_KEY = "transformer_config"


def save_checkpoint(model: Transformer, path: Path, dtype: torch.dtype = torch.float32) -> None:
    """Write the weights (tied embedding stored once) with the config in the file's metadata."""
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={CONFIG_KEY: json.dumps(model.cfg.to_dict())})
    tmp.replace(path)  # atomic: an interrupted save never leaves a half-written checkpoint


def read_config(path: Path) -> TransformerConfig:
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    if CONFIG_KEY not in metadata:
        raise ValueError(f"{path} is not a Transformer checkpoint of this project (no {CONFIG_KEY})")
    return TransformerConfig.from_dict(json.loads(metadata[CONFIG_KEY]))


def load_state(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)


def load_checkpoint(path: Path, device: str | torch.device = "cpu") -> Transformer:
    """Rebuild the model from the checkpoint alone, in fp32 and eval mode."""
    model = Transformer(read_config(path))
    model.load_state_dict(load_state(path))
    return model.to(device).eval()


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    states = [load_state(p) for p in paths]
    return {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}
