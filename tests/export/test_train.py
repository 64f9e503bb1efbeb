"""Training CLI smoke test: a tiny model on a generated corpus, checkpoints, averaging, resuming."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from export.checkpoint import load_checkpoint, load_state
from export.train import inverse_sqrt, label_smoothed_loss, main

EN_DE = {
    "a": "ein",
    "man": "mann",
    "dog": "hund",
    "red": "rot",
    "big": "groß",
    "runs": "läuft",
    "sees": "sieht",
}


def write_corpus(data_dir: Path, n_train: int = 60, n_val: int = 12) -> None:
    rng = random.Random(0)
    words = list(EN_DE)
    for split, n in (("train", n_train), ("val", n_val)):
        en = [[rng.choice(words) for _ in range(rng.randint(2, 6))] for _ in range(n)]
        (data_dir / f"{split}.en").write_text("\n".join(" ".join(s) for s in en) + "\n", encoding="utf-8")
        (data_dir / f"{split}.de").write_text(
            "\n".join(" ".join(EN_DE[w] for w in s) for s in en) + "\n", encoding="utf-8"
        )


def args(data: Path, work: Path, epochs: int, *extra: str) -> list[str]:
    return [
        "--data-dir", str(data), "--work-dir", str(work), "--epochs", str(epochs), "--vocab-size", "60",
        "--d-model", "16", "--heads", "2", "--d-ff", "32", "--layers", "1", "--max-len", "32",
        "--max-tokens", "128", "--warmup", "10", "--threads", "1", "--device", "cpu", *extra,
    ]  # fmt: skip


def test_train_writes_checkpoints_averages_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2 epochs leave epoch checkpoints, best, state.pt, history.json and the 2-checkpoint average;
    rerunning with --epochs 3 resumes after epoch 2 and ends exactly where a 3-epoch run ends."""
    data = tmp_path / "data"
    data.mkdir()
    write_corpus(data)
    work = tmp_path / "run"

    main(args(data, work, 2, "--average-last", "2"))
    out = capsys.readouterr().out
    for name in ("epoch001", "epoch002", "best", "averaged"):
        assert (work / f"{name}.safetensors").exists(), name
    assert (work / "state.pt").exists() and (work / "tokenizer.json").exists()
    history = json.loads((work / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    assert all(h["train_loss"] > 0 and h["val_loss"] > 0 for h in history)
    assert '"averaged": ["epoch001.safetensors", "epoch002.safetensors"]' in out
    e1, e2 = load_state(work / "epoch001.safetensors"), load_state(work / "epoch002.safetensors")
    averaged = load_state(work / "averaged.safetensors")
    for k in averaged:
        assert_close(averaged[k], (e1[k] + e2[k]) / 2, atol=1e-6, rtol=1e-5)
    assert load_checkpoint(work / "averaged.safetensors").cfg.d_model == 16

    main(args(data, work, 3))
    out = capsys.readouterr().out
    assert "resumed after epoch 2" in out
    history = json.loads((work / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert torch.load(work / "state.pt", weights_only=False)["epoch"] == 3

    straight = tmp_path / "straight"
    main(args(data, straight, 3))
    resumed, uninterrupted = (
        load_state(work / "epoch003.safetensors"),
        load_state(straight / "epoch003.safetensors"),
    )
    for k in uninterrupted:
        assert_close(resumed[k], uninterrupted[k], atol=0, rtol=0, msg=f"resumed training diverged at {k}")


def test_schedule_and_loss() -> None:
    """lr factor rises linearly to 1 at warmup then decays as √(warmup/step); the loss is summed
    label-smoothed cross-entropy that ignores padding."""
    assert inverse_sqrt(0, 10) == inverse_sqrt(1, 10) == 0.1
    assert inverse_sqrt(10, 10) == 1.0
    assert inverse_sqrt(40, 10) == pytest.approx(0.5)
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[4, 5, 0], [6, 0, 0]])
    loss = label_smoothed_loss(logits, target, pad_id=0, smoothing=0.1)
    logp = logits.log_softmax(-1)
    real = target != 0
    nll = -logp.gather(-1, target[..., None])[..., 0]
    smooth = -logp.mean(-1)
    assert_close(loss, ((0.9 * nll + 0.1 * smooth) * real).sum())
