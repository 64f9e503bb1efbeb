"""The PyTorch translation reference: translate_ids, the ``python -m export.sources.ours.translate`` CLI and
TorchDecoder under the service's search."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from export.sources.ours.checkpoint import load_checkpoint, save_checkpoint
from export.sources.ours.data import encode_source, pad, train_tokenizer
from export.sources.ours.model import Transformer, TransformerConfig
from export.sources.ours.translate import EnsembleDecoder, TorchDecoder, main, translate, translate_ids
from service.engine.translation.search_loop import beam_search
from service.engine.translation.sentence_search import TokenHypothesis
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


# The service's search over the PyTorch model: the reference the ONNX engine is compared against.


def test_torch_greedy_search_equals_a_naive_full_recompute_loop() -> None:
    """beam_search(TorchDecoder, beam 1) over a padded batch gives exactly the tokens of re-running
    the whole model on each growing prefix and taking the argmax."""
    cfg = TransformerConfig(
        vocab_size=40,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_len=32,
        dropout=0.0,
    )
    torch.manual_seed(0)
    model = Transformer(cfg).double().eval()
    with torch.no_grad():  # make </s> likelier so some sentences stop early
        model.embed.weight[cfg.eos_id] *= 3
    sources = [[5, 6, 7, 8, 9, 2], [10, 11, 2], [12, 2], [13, 14, 15, 16, 2]]
    max_len = 10

    def naive(src_ids: list[int]) -> list[int]:
        src, out = torch.tensor([src_ids]), [cfg.bos_id]
        with torch.no_grad():
            for _ in range(max_len):
                token = int(model(src, torch.tensor([out]))[0, -1].argmax())
                if token == cfg.eos_id:
                    break
                out.append(token)
        return out[1:]

    with torch.no_grad():
        dec = TorchDecoder(model, pad(sources, cfg.pad_id), with_attention=True)
        hyps = beam_search(
            dec, len(sources), beam_size=1, max_len=max_len, bos_id=cfg.bos_id, eos_id=cfg.eos_id
        )
    expected = [naive(s) for s in sources]
    assert [h[0].tokens for h in hyps] == expected
    assert any(len(t) < max_len for t in expected), "the test should cover a sentence ending with </s>"
    for s, h in zip(sources, hyps, strict=True):
        alignment = h[0].alignment
        assert alignment is not None and alignment.shape == (len(h[0].tokens), len(max(sources, key=len)))
        assert (alignment[:, len(s) :] == 0).all()  # padded source positions get no attention


def tiny(seed: int, vocab_size: int = 40) -> Transformer:
    """A random one-layer model in float64, eval mode."""
    cfg = TransformerConfig(
        vocab_size=vocab_size,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=1,
        max_len=32,
        dropout=0.0,
    )
    torch.manual_seed(seed)
    return Transformer(cfg).double().eval()


def test_torch_beam_search_is_independent_of_batching() -> None:
    """Beam search over a padded batch (rows leaving as sentences finish) equals searching each
    sentence alone: TorchDecoder.reorder keeps the caches and masks of the right rows."""
    model = tiny(1)
    cfg = model.cfg
    with torch.no_grad():
        model.embed.weight[cfg.eos_id] *= 3
    sources = [[5, 6, 7, 2], [8, 2], [9, 10, 11, 12, 13, 2]]

    def run(batch: list[list[int]]) -> list[list[TokenHypothesis]]:
        with torch.no_grad():
            return beam_search(
                TorchDecoder(model, pad(batch, cfg.pad_id)),
                len(batch),
                beam_size=3,
                n_best=3,
                max_len=8,
                bos_id=cfg.bos_id,
                eos_id=cfg.eos_id,
            )

    together = run(sources)
    for s, h in zip(sources, together, strict=True):
        (alone,) = run([s])
        assert [x.tokens for x in h] == [x.tokens for x in alone]
        np.testing.assert_allclose([x.score for x in h], [x.score for x in alone], rtol=1e-5)


# Ensembles: several models of one vocabulary, each step's probabilities averaged.


def test_an_ensemble_step_averages_the_models_probabilities() -> None:
    """log p = log((p_a + p_b) / 2) per token, rows reordered together; the alignments are the
    first model's."""
    a, b = tiny(2), tiny(3)
    src = pad([[5, 6, 7, 2], [8, 2]], a.cfg.pad_id)
    rows = np.array([0, 0, 1], dtype=np.int64)
    with torch.no_grad():
        ensemble = EnsembleDecoder([TorchDecoder(a, src, with_attention=True), TorchDecoder(b, src)])
        alone_a, alone_b = TorchDecoder(a, src, with_attention=True), TorchDecoder(b, src)
        for decoder in (ensemble, alone_a, alone_b):
            decoder.reorder(rows)
        tokens = np.array([a.cfg.bos_id] * 3, dtype=np.int64)
        for _ in range(3):
            logp, attention = ensemble.step(tokens)
            (logp_a, attention_a), (logp_b, _) = alone_a.step(tokens), alone_b.step(tokens)
            expected = np.log((np.exp(logp_a) + np.exp(logp_b)) / 2)
            np.testing.assert_allclose(logp, expected, rtol=1e-5, atol=1e-6)
            assert attention is not None and attention_a is not None
            np.testing.assert_array_equal(attention, attention_a)
            tokens = logp.argmax(-1)


def test_an_ensemble_of_one_model_twice_translates_as_the_model() -> None:
    model = tiny(4)
    with torch.no_grad():
        model.embed.weight[model.cfg.eos_id] *= 3
    sources = [[5, 6, 7, 2], [8, 2], [9, 10, 11, 12, 13, 2]]
    alone = translate_ids(model, sources, beam_size=3, max_len=8)
    assert translate_ids([model, model], sources, beam_size=3, max_len=8) == alone
    assert translate_ids([model], sources, beam_size=3, max_len=8) == alone


def test_an_ensemble_needs_one_vocabulary() -> None:
    with pytest.raises(ValueError, match="one vocabulary"):
        translate_ids([tiny(5), tiny(5, vocab_size=41)], [[5, 2]], beam_size=2)
