"""Attention and activation dropout: off by default, so models train as before the options existed."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from export.sources.ours.model import Transformer, TransformerConfig

CFG = TransformerConfig(
    vocab_size=40,
    d_model=16,
    n_heads=2,
    d_ff=32,
    n_encoder_layers=2,
    n_decoder_layers=1,
    max_len=16,
    dropout=0.1,
)
SRC = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
TGT = torch.tensor([[1, 11, 12, 13], [1, 14, 15, 2]])


def train_mode_logits(cfg: TransformerConfig, seed: int = 3) -> torch.Tensor:
    torch.manual_seed(0)
    model = Transformer(cfg).train()
    torch.manual_seed(seed)
    return model(SRC, TGT)


def test_a_config_from_before_the_options_reads_as_the_defaults() -> None:
    """A checkpoint's config without the new keys: no attention dropout, the FFN's at ``dropout``."""
    old = {k: v for k, v in CFG.to_dict().items() if k not in ("attention_dropout", "activation_dropout")}
    cfg = TransformerConfig.from_dict(old)
    assert cfg == CFG and cfg.attention_dropout == 0.0 and cfg.ffn_dropout == 0.1


def test_defaults_draw_the_same_masks_as_dropout_alone() -> None:
    """With the defaults, training-mode outputs equal those of the FFN dropout set to ``dropout``
    explicitly (the same random numbers, drawn in the same order)."""
    explicit = TransformerConfig(**{**CFG.to_dict(), "attention_dropout": 0.0, "activation_dropout": 0.1})
    assert_close(train_mode_logits(CFG), train_mode_logits(explicit), atol=0, rtol=0)


def test_each_option_changes_training_but_not_inference() -> None:
    """Attention dropout or another activation dropout changes training-mode outputs and leaves the
    eval-mode model (what is exported and served) unchanged."""
    base = train_mode_logits(CFG)
    for change in ({"attention_dropout": 0.3}, {"activation_dropout": 0.0}):
        cfg = TransformerConfig(**{**CFG.to_dict(), **change})
        assert not torch.equal(train_mode_logits(cfg), base), change
        torch.manual_seed(0)
        changed = Transformer(cfg).eval()
        torch.manual_seed(0)
        default = Transformer(CFG).eval()
        with torch.no_grad():
            assert_close(changed(SRC, TGT), default(SRC, TGT), atol=0, rtol=0)


def test_attention_dropout_leaves_the_returned_weights_whole() -> None:
    """The weights decode returns (alignments) still sum to 1 over keys under attention dropout."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**{**CFG.to_dict(), "attention_dropout": 0.5})).train()
    memory_kv = model.memory_kv(model.encode(SRC))
    _, _, weights = model.decode(TGT, memory_kv, (SRC != 0)[:, None, None, :])
    assert_close(weights.sum(-1), torch.ones(2, 4))
