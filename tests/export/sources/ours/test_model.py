"""The Transformer's equations, checked numerically on tiny random models.

Every comparison runs in eval mode with dropout 0, so each test is exact up to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from export.sources.ours.model import (
    DecoderLayer,
    EncoderLayer,
    MultiHeadAttention,
    PositionalEncoding,
    Transformer,
    TransformerConfig,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)

CPU = torch.device("cpu")
CFG = TransformerConfig(
    vocab_size=50,
    d_model=32,
    n_heads=4,
    d_ff=64,
    n_encoder_layers=2,
    n_decoder_layers=2,
    max_len=64,
    dropout=0.0,
)


@pytest.fixture
def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CFG).eval()


def random_ids(*shape: int, lengths: list[int] | None = None, seed: int = 1) -> torch.Tensor:
    """Non-special ids (4..V-1); rows right-padded with pad_id beyond ``lengths``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, CFG.vocab_size, shape, generator=g)
    for row, n in enumerate(lengths or []):
        ids[row, n:] = CFG.pad_id
    return ids


def test_config_rejects_heads_that_do_not_divide_d_model() -> None:
    """d_model must split evenly into heads (and be even for sin/cos pairs)."""
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="even"):
        TransformerConfig(vocab_size=10, d_model=9, n_heads=3)
    assert TransformerConfig.from_dict({**CFG.to_dict(), "unknown": 1}) == CFG


# 1. Attention is a softmax over keys; padding gets no weight.


def test_attention_weights_are_a_softmax_over_keys_with_zero_weight_on_padding() -> None:
    """Weights are ≥ 0, each query's row sums to 1, and padded keys get exactly 0."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4).eval()
    src = random_ids(3, 7, lengths=[7, 4, 1])
    x_q, x_kv = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    _, w = mha(x_q, x_kv, padding_mask(src, CFG.pad_id))
    assert w.shape == (3, 4, 5, 7)
    assert (w >= 0).all()
    assert_close(w.sum(-1), torch.ones(3, 4, 5))
    pad = (src == CFG.pad_id)[:, None, None, :].expand_as(w)
    assert (w[pad] == 0).all(), "padded keys must get exactly zero weight"
    assert (w[~pad] > 0).all()
    assert_close(w[2, :, :, 0], torch.ones(4, 5))  # a single real key takes all the weight


def test_cross_attention_weights_of_the_model_ignore_source_padding(model: Transformer) -> None:
    """decode's head-averaged cross-attention rows sum to 1 and are 0 on padded source positions."""
    src = random_ids(2, 6, lengths=[6, 3])
    tgt = random_ids(2, 5, seed=2)
    _, _, attn = model.decode(tgt, model.memory_kv(model.encode(src)), padding_mask(src, CFG.pad_id))
    assert attn.shape == (2, 5, 6)
    assert_close(attn.sum(-1), torch.ones(2, 5))
    assert (attn[1, :, 3:] == 0).all()


# 2. The causal mask.


def test_causal_mask_lets_each_query_see_itself_and_the_past_only() -> None:
    """causal_mask(T, T) is lower triangular; with a cache the queries sit at the end."""
    assert torch.equal(causal_mask(4, 4, CPU), torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(causal_mask(2, 5, CPU), torch.ones(5, 5, dtype=torch.bool).tril()[3:])
    assert causal_mask(1, 5, CPU).all()


def test_future_target_tokens_never_change_earlier_outputs(model: Transformer) -> None:
    """Changing target token j leaves logits at positions < j unchanged and changes every later one."""
    src = random_ids(2, 6, lengths=[6, 4])
    tgt = random_ids(2, 7, seed=3)
    with torch.no_grad():
        ref = model(src, tgt)
        for j in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[:, j] = (tgt[:, j] - 4 + 1) % (CFG.vocab_size - 4) + 4  # another real token
            out = model(src, changed)
            assert_close(out[:, :j], ref[:, :j], atol=1e-6, rtol=1e-6)
            assert ((out[:, j:] - ref[:, j:]).abs().amax(-1) > 1e-4).all(), (
                f"position ≥ {j} must depend on {j}"
            )


# 3. Self-attention without positions is permutation-equivariant.


def test_encoder_layer_is_permutation_equivariant() -> None:
    """EncoderLayer(x[π]) = EncoderLayer(x)[π], with and without a (permuted) padding mask."""
    torch.manual_seed(0)
    layer = EncoderLayer(CFG).eval()
    x = torch.randn(2, 7, 32)
    mask = padding_mask(random_ids(2, 7, lengths=[7, 5]), CFG.pad_id)
    perm = torch.tensor([3, 6, 0, 2, 5, 1, 4])
    with torch.no_grad():
        assert_close(layer(x[:, perm], None), layer(x, None)[:, perm], atol=1e-5, rtol=1e-5)
        assert_close(layer(x[:, perm], mask[..., perm]), layer(x, mask)[:, perm], atol=1e-5, rtol=1e-5)


def test_positional_encoding_breaks_the_symmetry(model: Transformer) -> None:
    """With positions added, the full encoder is not permutation-equivariant (order matters)."""
    src = random_ids(1, 6)
    perm = torch.tensor([5, 4, 3, 2, 1, 0])
    with torch.no_grad():
        assert not torch.allclose(model.encode(src[:, perm]), model.encode(src)[:, perm], atol=1e-3)


# 4. Sinusoidal positions.


def test_positional_encoding_matches_the_formula() -> None:
    """pe[k, 2i] = sin(k / 10000^(2i/d)), pe[k, 2i+1] = cos(k / 10000^(2i/d)), computed in float64."""
    d, length = 32, 256
    ref = np.zeros((length, d))
    for k in range(length):
        for i in range(d // 2):
            angle = k / 10000 ** (2 * i / d)
            ref[k, 2 * i] = math.sin(angle)
            ref[k, 2 * i + 1] = math.cos(angle)
    pos = PositionalEncoding(d, length)
    np.testing.assert_allclose(pos.pe.double().numpy(), ref, atol=1e-4, rtol=0)
    x = torch.randn(2, 5, d)
    assert_close(pos(x, offset=7), x + torch.from_numpy(ref[7:12]).float(), atol=1e-4, rtol=0)


# 5. One head is scaled dot-product attention on its slice of the projections.


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
def test_each_head_equals_torch_scaled_dot_product_attention(mask_kind: str) -> None:
    """head_i = softmax(Q_i K_iᵀ/√d_k) V_i as computed by F.scaled_dot_product_attention on
    the i-th d_k columns of the projections, and the output is Concat(heads) W_o."""
    torch.manual_seed(0)
    h, d_k = 4, 8
    mha = MultiHeadAttention(h * d_k, h).eval()
    x_q = torch.randn(2, 5, 32)
    x_kv = x_q if mask_kind == "causal" else torch.randn(2, 7, 32)
    mask = {
        "none": None,
        "padding": padding_mask(random_ids(2, 7, lengths=[7, 3]), CFG.pad_id),  # (B, 1, 1, S)
        "causal": causal_mask(5, 5, CPU),  # (T, T)
    }[mask_kind]
    with torch.no_grad():
        out, weights = mha(x_q, x_kv, mask)
        heads = []
        for i in range(h):
            cols = slice(i * d_k, (i + 1) * d_k)
            q = F.linear(x_q, mha.w_q.weight[cols], mha.w_q.bias[cols])  # (B, T, d_k)
            k = F.linear(x_kv, mha.w_k.weight[cols], mha.w_k.bias[cols])
            v = F.linear(x_kv, mha.w_v.weight[cols], mha.w_v.bias[cols])
            head_mask = None if mask is None else mask[:, 0] if mask.dim() == 4 else mask
            head = F.scaled_dot_product_attention(q, k, v, attn_mask=head_mask)
            assert_close(weights[:, i] @ v, head, atol=1e-5, rtol=1e-5)
            heads.append(head)
        assert_close(out, mha.w_o(torch.cat(heads, dim=-1)), atol=1e-5, rtol=1e-5)

        # The module-level function on 4-d inputs too.
        q4, k4, v4 = torch.randn(2, h, 5, d_k), torch.randn(2, h, 7, d_k), torch.randn(2, h, 7, d_k)
        m4 = None if mask_kind != "padding" else mask
        assert_close(
            scaled_dot_product_attention(q4, k4, v4, m4)[0],
            F.scaled_dot_product_attention(q4, k4, v4, attn_mask=m4),
            atol=1e-5,
            rtol=1e-5,
        )


# 6. Parity with torch.nn's Transformer layers.


def copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    assert theirs.in_proj_bias is not None
    theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    theirs.out_proj.load_state_dict(ours.w_o.state_dict())


def test_encoder_layer_equals_torch_transformer_encoder_layer() -> None:
    """Post-LN self-attention + ReLU FFN equals nn.TransformerEncoderLayer with the same weights."""
    torch.manual_seed(0)
    ours = EncoderLayer(CFG).eval()
    ref = nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, activation="relu", norm_first=False, batch_first=True
    ).eval()
    with torch.no_grad():
        copy_attention(ours.self_attn, ref.self_attn)
        ref.linear1.load_state_dict(ours.ffn.w_1.state_dict())
        ref.linear2.load_state_dict(ours.ffn.w_2.state_dict())
        ref.norm1.load_state_dict(ours.norm1.state_dict())
        ref.norm2.load_state_dict(ours.norm2.state_dict())
    src = random_ids(3, 7, lengths=[7, 4, 2])
    x = torch.randn(3, 7, 32)
    got = ours(x, padding_mask(src, CFG.pad_id))
    want = ref(x, src_key_padding_mask=src == CFG.pad_id)
    assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_decoder_layer_equals_torch_transformer_decoder_layer() -> None:
    """Masked self-attention, cross-attention and FFN equal nn.TransformerDecoderLayer with a causal
    tgt_mask and a memory key padding mask."""
    torch.manual_seed(0)
    ours = DecoderLayer(CFG).eval()
    ref = nn.TransformerDecoderLayer(
        32, 4, 64, dropout=0.0, activation="relu", norm_first=False, batch_first=True
    ).eval()
    with torch.no_grad():
        copy_attention(ours.self_attn, ref.self_attn)
        copy_attention(ours.cross_attn, ref.multihead_attn)
        ref.linear1.load_state_dict(ours.ffn.w_1.state_dict())
        ref.linear2.load_state_dict(ours.ffn.w_2.state_dict())
        for i in (1, 2, 3):
            getattr(ref, f"norm{i}").load_state_dict(getattr(ours, f"norm{i}").state_dict())
    src = random_ids(3, 7, lengths=[7, 5, 1])
    y, memory = torch.randn(3, 6, 32), torch.randn(3, 7, 32)
    self_mask = causal_mask(6, 6, CPU)
    got, _, _ = ours(y, ours.cross_attn.project_kv(memory), self_mask, padding_mask(src, CFG.pad_id))
    want = ref(y, memory, tgt_mask=~self_mask, memory_key_padding_mask=src == CFG.pad_id)
    assert_close(got, want, atol=1e-5, rtol=1e-5)


# 7. Cached incremental decoding.


def test_cached_decoding_equals_full_recomputation(model: Transformer) -> None:
    """decode with ``past``, one token at a time, reproduces the full-prefix logits and cross-attention
    at every step; the cache grows by one position per step."""
    src = random_ids(2, 6, lengths=[6, 3])
    tgt = random_ids(2, 8, seed=4)
    tgt[:, 0] = CFG.bos_id
    with torch.no_grad():
        memory_kv = model.memory_kv(model.encode(src))
        src_mask = padding_mask(src, CFG.pad_id)
        full_logits, full_cache, full_attn = model.decode(tgt, memory_kv, src_mask)
        past = None
        for t in range(tgt.size(1)):
            logits, past, attn = model.decode(tgt[:, t : t + 1], memory_kv, src_mask, past)
            assert_close(logits[:, 0], full_logits[:, t], atol=1e-5, rtol=1e-4)
            assert_close(attn[:, 0], full_attn[:, t], atol=1e-6, rtol=1e-5)
            assert [kv[0].shape for kv in past] == [(2, 4, t + 1, 8)] * CFG.n_decoder_layers
        assert past is not None
        for (k, v), (k_full, v_full) in zip(past, full_cache, strict=True):
            assert_close(k, k_full, atol=1e-5, rtol=1e-4)
            assert_close(v, v_full, atol=1e-5, rtol=1e-4)


def test_cached_decoding_of_several_tokens_at_once(model: Transformer) -> None:
    """A 3-token prefix, then 3 tokens in one call with that cache, equal the full 6-token decode."""
    src = random_ids(2, 5, lengths=[5, 2])
    tgt = random_ids(2, 6, seed=5)
    with torch.no_grad():
        memory_kv = model.memory_kv(model.encode(src))
        src_mask = padding_mask(src, CFG.pad_id)
        full, _, full_attn = model.decode(tgt, memory_kv, src_mask)
        first, past, _ = model.decode(tgt[:, :3], memory_kv, src_mask)
        rest, _, rest_attn = model.decode(tgt[:, 3:], memory_kv, src_mask, past)
    assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-4)
    assert_close(rest_attn, full_attn[:, 3:], atol=1e-6, rtol=1e-5)


# 8. The whole model: forward, tied and scaled embeddings.


def test_forward_is_encode_then_decode(model: Transformer) -> None:
    """forward(src, tgt) = decode(tgt, memory_kv(encode(src)), padding_mask(src))."""
    src = random_ids(2, 6, lengths=[6, 2])
    tgt = random_ids(2, 4, seed=6)
    with torch.no_grad():
        logits = model(src, tgt)
        memory = model.encode(src)
        assert memory.shape == (2, 6, 32)
        ref = model.decode(tgt, model.memory_kv(memory), padding_mask(src, CFG.pad_id))[0]
    assert logits.shape == (2, 4, CFG.vocab_size)
    assert_close(logits, ref, atol=0, rtol=0)


def test_output_projection_is_the_tied_embedding_matrix(model: Transformer) -> None:
    """logits = y · Eᵀ with E the embedding itself: no other (V, d) weight exists, and a token that
    appears in no input still gets a gradient on its embedding row (through the output layer)."""
    vocab_weights = [n for n, p in model.named_parameters() if CFG.vocab_size in p.shape]
    assert vocab_weights == ["embed.weight"]
    assert model.state_dict()["embed.weight"].data_ptr() == model.embed.weight.data_ptr()

    captured: list[torch.Tensor] = []
    model.decoder[-1].register_forward_hook(lambda _m, _a, out: captured.append(out[0]))
    src, tgt = random_ids(1, 5), random_ids(1, 4, seed=7)
    logits = model(src, tgt)
    assert_close(logits, captured[0] @ model.embed.weight.t(), atol=1e-6, rtol=1e-6)

    unused = sorted(set(range(4, CFG.vocab_size)) - set(src.flatten().tolist()) - set(tgt.flatten().tolist()))
    logits[..., unused[0]].sum().backward()
    assert model.embed.weight.grad is not None
    assert model.embed.weight.grad[unused[0]].abs().sum() > 0
    assert (model.embed.weight[CFG.pad_id] == 0).all()


def test_embeddings_are_scaled_by_sqrt_d_model(model: Transformer) -> None:
    """The first layer sees E[x]·√d_model + PE(position), positions offset by the cache length."""
    seen: list[torch.Tensor] = []
    model.encoder[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    model.decoder[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    src, tgt = random_ids(2, 5), random_ids(2, 3, seed=8)
    scale = math.sqrt(CFG.d_model)
    pe = model.pos.pe
    with torch.no_grad():
        memory_kv = model.memory_kv(model.encode(src))
        src_mask = padding_mask(src, CFG.pad_id)
        _, past, _ = model.decode(tgt[:, :2], memory_kv, src_mask)
        model.decode(tgt[:, 2:], memory_kv, src_mask, past)
    assert_close(seen[0], model.embed.weight[src] * scale + pe[:5])
    assert_close(seen[1], model.embed.weight[tgt[:, :2]] * scale + pe[:2])
    assert_close(seen[2], model.embed.weight[tgt[:, 2:]] * scale + pe[2:3])


# 9. Pre-LN (norm_first): torch's layers with norm_first=True, cached decoding, checkpoints.

PRE_LN = replace(CFG, norm_first=True)


def test_pre_ln_layers_equal_torch_norm_first_layers() -> None:
    torch.manual_seed(0)
    encoder, decoder = EncoderLayer(PRE_LN).eval(), DecoderLayer(PRE_LN).eval()
    ref_encoder = nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, activation="relu", norm_first=True, batch_first=True
    ).eval()
    ref_decoder = nn.TransformerDecoderLayer(
        32, 4, 64, dropout=0.0, activation="relu", norm_first=True, batch_first=True
    ).eval()
    with torch.no_grad():
        for ours, ref in ((encoder, ref_encoder), (decoder, ref_decoder)):
            copy_attention(ours.self_attn, ref.self_attn)
            ref.linear1.load_state_dict(ours.ffn.w_1.state_dict())
            ref.linear2.load_state_dict(ours.ffn.w_2.state_dict())
            for i in (1, 2, 3) if ours is decoder else (1, 2):
                getattr(ref, f"norm{i}").load_state_dict(getattr(ours, f"norm{i}").state_dict())
        copy_attention(decoder.cross_attn, ref_decoder.multihead_attn)
    src = random_ids(3, 7, lengths=[7, 4, 2])
    x = torch.randn(3, 7, 32)
    assert_close(
        encoder(x, padding_mask(src, CFG.pad_id)), ref_encoder(x, src_key_padding_mask=src == CFG.pad_id)
    )
    y, self_mask = torch.randn(3, 6, 32), causal_mask(6, 6, CPU)
    got, _, _ = decoder(y, decoder.cross_attn.project_kv(x), self_mask, padding_mask(src, CFG.pad_id))
    want = ref_decoder(y, x, tgt_mask=~self_mask, memory_key_padding_mask=src == CFG.pad_id)
    assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_pre_ln_model_decodes_cached_as_in_full_and_post_ln_checkpoints_keep_their_keys() -> None:
    torch.manual_seed(0)
    model = Transformer(PRE_LN).eval()
    src, tgt = random_ids(2, 6, lengths=[6, 3]), random_ids(2, 5, seed=4)
    with torch.no_grad():
        memory_kv = model.memory_kv(model.encode(src))
        src_mask = padding_mask(src, CFG.pad_id)
        full, _, _ = model.decode(tgt, memory_kv, src_mask)
        past = None
        for t in range(tgt.size(1)):
            logits, past, _ = model.decode(tgt[:, t : t + 1], memory_kv, src_mask, past)
            assert_close(logits[:, 0], full[:, t], atol=1e-5, rtol=1e-4)
    pre_keys = set(model.state_dict())
    post_keys = set(Transformer(CFG).state_dict())
    assert pre_keys - post_keys == {
        f"{s}_norm.{p}" for s in ("encoder", "decoder") for p in ("weight", "bias")
    }
    assert post_keys <= pre_keys
    assert TransformerConfig.from_dict({k: v for k, v in CFG.to_dict().items() if k != "norm_first"}) == CFG
