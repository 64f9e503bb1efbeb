"""What a training run keeps and resumes from: the model, its optimiser and schedule and the run's
progress (``Run``); each epoch's checkpoint, the best one so far, history.json, and state.pt, from
which a rerun of the same command goes on as if never stopped."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from export.sources.ours.checkpoint import save_checkpoint
from export.sources.ours.model import Transformer, TransformerConfig


@dataclass
class Run:
    """What the epochs change and state.pt keeps: the model, its optimiser and schedule, the last
    epoch done, the best validation BLEU so far and every epoch's record."""

    cfg: TransformerConfig
    model: Transformer
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    device: torch.device
    epoch: int = 0
    best_bleu: float = -1.0
    history: list[dict[str, Any]] = field(default_factory=list)


def resume(run: Run, state_path: Path) -> None:
    """Continue from state.pt where an earlier run of the same command left it, random states
    included, so that the epochs after it are those of a run never stopped."""
    if not state_path.exists():
        return
    state: dict[str, Any] = torch.load(state_path, map_location=run.device, weights_only=False)
    if TransformerConfig.from_dict(state["config"]) != run.cfg:
        raise SystemExit(f"{state_path} was trained with another config; use a new --work-dir")
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.epoch, run.best_bleu, run.history = state["epoch"], state["best_bleu"], state["history"]
    random.setstate(state["py_rng"])
    torch.set_rng_state(state["torch_rng"])
    if run.device.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"], run.device)
    print(f"resumed after epoch {run.epoch} (best val BLEU {run.best_bleu:.2f})")


def save_state(run: Run, state_path: Path) -> None:
    """state.pt, written whole or not at all: a run stopped while writing resumes from the last."""
    tmp = state_path.with_suffix(".tmp")
    torch.save(
        {
            "config": run.cfg.to_dict(),
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(),
            "epoch": run.epoch,
            "best_bleu": run.best_bleu,
            "history": run.history,
            "py_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
            **({"cuda_rng": torch.cuda.get_rng_state(run.device)} if run.device.type == "cuda" else {}),
        },
        tmp,
    )
    tmp.replace(state_path)


def keep_epoch(run: Run, work: Path, epoch: int, bleu: float, keep_last: int) -> None:
    """The epoch's checkpoint (only the last ``keep_last`` stay), best.safetensors when its
    validation BLEU is the best so far, state.pt and history.json."""
    save_checkpoint(run.model, work / f"epoch{epoch:03d}.safetensors")
    stale = work / f"epoch{epoch - keep_last:03d}.safetensors"
    stale.unlink(missing_ok=True)
    if bleu > run.best_bleu:
        run.best_bleu = bleu
        save_checkpoint(run.model, work / "best.safetensors")
    run.epoch = epoch
    save_state(run, work / "state.pt")
    (work / "history.json").write_text(json.dumps(run.history, indent=1))
