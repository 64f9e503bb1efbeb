"""The PyTorch translation reference: translate_ids and the ``python -m export.translate`` CLI."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from export.checkpoint import load_checkpoint, save_checkpoint
from export.data import encode_source, train_tokenizer
from export.model import Transformer, TransformerConfig
from export.translate import main, translate, translate_ids
from tests.tiny_models import WORDS

TEXTS = ["a man rides a bike.", "two dogs run.", "a small cat sits on the big red street."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model and its tokenizer, saved side by side as the CLI expects."""
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) + "." for i in range(len(WORDS))] * 3
    tok = train_tokenizer(corpus, vocab_size=80)
    torch.manual_seed(0)
    cfg = TransformerConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=1,
        max_len=40,
        dropout=0.0,
    )
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_checkpoint(Transformer(cfg), path)
    tok.save(str(path.parent / "tokenizer.json"))
    return path


def test_cli_translates_arguments_files_and_stdin(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One output line per input sentence, from arguments, --input or stdin, equal to translate()."""
    from tokenizers import Tokenizer

    model = load_checkpoint(checkpoint)
    tok = Tokenizer.from_file(str(checkpoint.parent / "tokenizer.json"))
    expected = translate(model, tok, TEXTS, beam_size=2)

    main([*TEXTS, "--checkpoint", str(checkpoint), "--beam", "2"])
    assert capsys.readouterr().out.splitlines() == expected

    inp = tmp_path / "in.en"
    inp.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    main(
        [
            "--input",
            str(inp),
            "--checkpoint",
            str(checkpoint),
            "--tokenizer",
            str(checkpoint.parent / "tokenizer.json"),
            "--beam",
            "2",
            "--batch-size",
            "2",
        ]
    )
    assert capsys.readouterr().out.splitlines() == expected

    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(TEXTS[:2]) + "\n"))
    main(["--checkpoint", str(checkpoint), "--beam", "2"])
    assert capsys.readouterr().out.splitlines() == expected[:2]


def test_translate_ids_keeps_input_order_across_batches(checkpoint: Path) -> None:
    """Length-sorted batching is undone: results come back in input order, whatever the batch size,
    and each is at most max_len tokens without <s>/</s>."""
    from tokenizers import Tokenizer

    model = load_checkpoint(checkpoint)
    tok = Tokenizer.from_file(str(checkpoint.parent / "tokenizer.json"))
    src = encode_source(tok, TEXTS, model.cfg.max_len)
    one_by_one = [translate_ids(model, [s], beam_size=3, max_len=6)[0] for s in src]
    assert translate_ids(model, src, beam_size=3, max_len=6, batch_size=2) == one_by_one
    for ids in one_by_one:
        assert len(ids) <= 6 and model.cfg.eos_id not in ids
