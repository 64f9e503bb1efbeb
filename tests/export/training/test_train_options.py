"""Training options for bounded GPU calls: two depths, attention/activation dropout, --max-minutes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from export.sources.ours.checkpoint import load_checkpoint
from export.training.train import main
from tests.export.training.test_train import args, write_corpus


@pytest.fixture
def data(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    directory.mkdir()
    write_corpus(directory, n_train=30, n_val=6)
    return directory


def epochs_done(work: Path) -> list[int]:
    return [h["epoch"] for h in json.loads((work / "history.json").read_text())]


def test_depths_and_dropouts_reach_the_checkpoint(data: Path, tmp_path: Path) -> None:
    """--encoder-layers/--decoder-layers override --layers; the dropouts are stored in the config."""
    work = tmp_path / "run"
    options = ["--encoder-layers", "3", "--decoder-layers", "1", "--attention-dropout", "0.1",
               "--activation-dropout", "0.2"]  # fmt: skip
    main(args(data, work, 1, *options))
    model = load_checkpoint(work / "epoch001.safetensors")
    assert (len(model.encoder), len(model.decoder)) == (3, 1)
    cfg = model.cfg
    assert (cfg.n_encoder_layers, cfg.n_decoder_layers) == (3, 1)
    assert (cfg.dropout, cfg.attention_dropout, cfg.activation_dropout) == (0.1, 0.1, 0.2)

    main(args(data, tmp_path / "plain", 1, "--decoder-layers", "2"))  # --layers 1 for the encoder
    plain = load_checkpoint(tmp_path / "plain" / "epoch001.safetensors").cfg
    assert (plain.n_encoder_layers, plain.n_decoder_layers) == (1, 2)
    assert (plain.attention_dropout, plain.activation_dropout) == (0.0, None)
    assert not plain.norm_first

    main(args(data, tmp_path / "pre-ln", 1, "--norm-first"))
    assert load_checkpoint(tmp_path / "pre-ln" / "epoch001.safetensors").cfg.norm_first


def test_max_minutes_stops_at_an_epoch_boundary_and_the_rerun_resumes(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An epoch starts only if the longest one so far would end within the limit: under a limit
    the setup alone spends, a fresh run stops before epoch 1 and a rerun after one epoch stops
    before epoch 2 with nothing lost; the same command with a generous limit resumes and ends
    exactly as an uninterrupted run."""
    work = tmp_path / "run"
    main(args(data, work, 3, "--max-minutes", "1e-9"))
    assert "stopped before epoch 1" in capsys.readouterr().out
    assert not (work / "state.pt").exists()

    main(args(data, work, 1))
    main(args(data, work, 3, "--max-minutes", "1e-9"))
    out = capsys.readouterr().out
    assert "resumed after epoch 1" in out and "stopped before epoch 2" in out
    assert epochs_done(work) == [1]
    assert torch.load(work / "state.pt", weights_only=False)["epoch"] == 1

    main(args(data, work, 2, "--max-minutes", "10"))
    assert epochs_done(work) == [1, 2]
    straight = tmp_path / "straight"
    main(args(data, straight, 2))
    resumed = load_checkpoint(work / "epoch002.safetensors").state_dict()
    uninterrupted = load_checkpoint(straight / "epoch002.safetensors").state_dict()
    for k, v in uninterrupted.items():
        assert torch.equal(resumed[k], v), k


def test_a_run_stopped_by_max_minutes_still_averages_its_last_epochs(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A time-bounded GPU run rarely finishes its --epochs: its last epochs are averaged all the
    same, with the average's validation scores in averaged.json for the ranking."""
    work = tmp_path / "run"
    main(args(data, work, 2))
    main(args(data, work, 5, "--max-minutes", "1e-9", "--average-last", "2"))
    assert "stopped before epoch 3" in capsys.readouterr().out
    averaged = json.loads((work / "averaged.json").read_text())
    assert averaged["averaged"] == ["epoch001.safetensors", "epoch002.safetensors"]
    assert 0.0 <= averaged["val_bleu_greedy"] <= 100.0 and averaged["val_loss"] > 0
    first, second = (load_checkpoint(work / f"epoch00{i}.safetensors").state_dict() for i in (1, 2))
    mean = load_checkpoint(work / "averaged.safetensors").state_dict()
    for k, v in mean.items():
        if v.is_floating_point():
            torch.testing.assert_close(v, (first[k] + second[k]) / 2)
