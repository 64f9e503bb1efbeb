"""A run's state: each epoch kept (the last few checkpoints, the best by validation BLEU, state.pt
and history.json), resumed from state.pt, and refused for a model of another configuration."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from export.sources.ours.checkpoint import load_state
from export.sources.ours.model import Transformer, TransformerConfig
from export.training.state import Run, keep_epoch, resume

CFG = TransformerConfig(vocab_size=16, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                        n_decoder_layers=1, max_len=16)  # fmt: skip


def tiny_run(cfg: TransformerConfig = CFG) -> Run:
    model = Transformer(cfg)
    optimizer = torch.optim.Adam(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return Run(cfg, model, optimizer, scheduler, torch.device("cpu"))


def test_kept_epochs_prune_old_checkpoints_keep_the_best_and_resume(tmp_path: Path) -> None:
    run = tiny_run()
    for epoch, bleu in enumerate([1.0, 3.0, 2.0], start=1):
        with torch.no_grad():
            next(run.model.parameters()).fill_(epoch)  # each epoch's weights told apart
        run.history.append({"epoch": epoch, "val_bleu_greedy": bleu})
        keep_epoch(run, tmp_path, epoch, bleu, keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("epoch*")) == ["epoch002.safetensors", "epoch003.safetensors"]
    best, second = load_state(tmp_path / "best.safetensors"), load_state(tmp_path / "epoch002.safetensors")
    assert all(torch.equal(best[k], second[k]) for k in second)
    assert json.loads((tmp_path / "history.json").read_text()) == run.history

    again = tiny_run()
    resume(again, tmp_path / "state.pt")
    assert (again.epoch, again.best_bleu, again.history) == (3, 3.0, run.history)
    last = load_state(tmp_path / "epoch003.safetensors")
    assert all(torch.equal(again.model.state_dict()[k], last[k]) for k in last)

    with pytest.raises(SystemExit, match="trained with another config"):
        resume(tiny_run(replace(CFG, d_ff=64)), tmp_path / "state.pt")
