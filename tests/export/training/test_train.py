"""Training CLI smoke test: a tiny model on a generated corpus, checkpoints, averaging, resuming."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from export.sources.ours.checkpoint import load_checkpoint, load_state
from export.sources.ours.data import token_batches
from export.sources.ours.model import Transformer, TransformerConfig
from export.training.train import consistency_loss, inverse_sqrt, label_smoothed_loss, main, training_loss

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


def test_rdrop_consistency_loss() -> None:
    """R-Drop's term is the mean of the two KL directions, summed over non-padding positions: zero
    for equal predictions, symmetric, and blind to what the padded positions predict."""
    a, b = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    target = torch.tensor([[4, 5, 0], [6, 0, 0]])
    real = (target != 0)[..., None]
    pa, pb = a.softmax(-1), b.softmax(-1)
    kl_ab = (pa * (pa.log() - pb.log()) * real).sum()
    kl_ba = (pb * (pb.log() - pa.log()) * real).sum()
    assert_close(consistency_loss(a, b, target, pad_id=0), (kl_ab + kl_ba) / 2)
    assert_close(consistency_loss(a, b, target, pad_id=0), consistency_loss(b, a, target, pad_id=0))
    assert float(consistency_loss(a, a.clone(), target, pad_id=0)) == pytest.approx(0.0, abs=1e-6)
    padded_elsewhere = b.clone()
    padded_elsewhere[1, 1:] = torch.randn(2, 7)
    assert_close(consistency_loss(a, b, target, 0), consistency_loss(a, padded_elsewhere, target, 0))


def test_rdrop_without_dropout_is_plain_training() -> None:
    """Without dropout the two passes agree, so the R-Drop objective and its gradients must equal
    plain training's (the doubled batch normalised as one); with dropout the term is positive."""
    src_ids, tgt_ids = [[5, 6, 7, 2], [8, 9, 2]], [[10, 11, 2], [12, 2]]
    batch = next(iter(token_batches(src_ids, tgt_ids, 64, pad_id=0)))
    cfg = TransformerConfig(vocab_size=16, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                            n_decoder_layers=1, max_len=16, dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg).train()

    def gradients(rdrop: float) -> tuple[torch.Tensor, float, list[torch.Tensor]]:
        model.zero_grad()
        objective, loss = training_loss(model, batch, 0.1, rdrop, bf16=False)
        objective.backward()
        return objective.detach(), loss, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain, rdrop = gradients(0.0), gradients(5.0)
    assert_close(rdrop[0], plain[0])
    assert rdrop[1] == pytest.approx(plain[1])
    for a, b in zip(rdrop[2], plain[2], strict=True):
        assert_close(a, b, atol=1e-6, rtol=1e-4)
    noisy = Transformer(TransformerConfig(**{**cfg.to_dict(), "dropout": 0.3})).train()
    objective, loss = training_loss(noisy, batch, 0.1, 5.0, bf16=False)
    assert float(objective.detach()) > loss / batch.n_tokens


def test_train_with_rdrop(tmp_path: Path) -> None:
    """--rdrop trains end to end: epoch checkpoints and finite losses."""
    data = tmp_path / "data"
    data.mkdir()
    write_corpus(data)
    main(args(data, tmp_path / "run", 2, "--dropout", "0.3", "--rdrop", "5"))
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    assert all(0 < h["train_loss"] < 100 and 0 < h["val_loss"] < 100 for h in history)
    assert (tmp_path / "run" / "epoch002.safetensors").exists()


def test_init_from_a_checkpoint_and_schedule_from(tmp_path: Path) -> None:
    """--init-from starts from the checkpoint's weights, architecture and tokenizer (with this run's
    dropout): at learning rate 0 the first epoch ends exactly there; --schedule-from N starts the
    learning-rate schedule at step N."""
    data = tmp_path / "data"
    data.mkdir()
    write_corpus(data)
    main(args(data, tmp_path / "base", 1))
    start = tmp_path / "base" / "epoch001.safetensors"
    tune = ["--init-from", str(start), "--dropout", "0.3", "--d-model", "32", "--layers", "2"]

    main(args(data, tmp_path / "frozen", 1, *tune, "--lr", "0"))
    frozen, base = load_state(tmp_path / "frozen" / "epoch001.safetensors"), load_state(start)
    assert frozen.keys() == base.keys()
    for k in base:
        assert torch.equal(frozen[k], base[k]), k
    cfg = load_checkpoint(tmp_path / "frozen" / "epoch001.safetensors").cfg
    assert (cfg.d_model, cfg.n_encoder_layers, cfg.dropout) == (16, 1, 0.3)
    tokenizer = (tmp_path / "frozen" / "tokenizer.json").read_text()
    assert tokenizer == (tmp_path / "base" / "tokenizer.json").read_text()

    main(args(data, tmp_path / "later", 1, *tune, "--lr", "1e-3", "--schedule-from", "40"))
    (record,) = json.loads((tmp_path / "later" / "history.json").read_text())
    assert record["lr"] == pytest.approx(1e-3 * inverse_sqrt(40 + record["step"], 10))
