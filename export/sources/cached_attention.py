"""Decoder self-attention over a slot-addressed key/value cache, written in place.

The decoder layout ``per_layer_kv_slots`` (export/graphs/translation_layout.py) gives every running
row a *slot*: cache buffers K, V of shape (B, h, L, d_head), where row b's first ``positions[b]``
columns hold its history (right-padded, unlike ``per_layer_kv_positions``). One step projects
the new token to Q, K and V with a single MatMul (fused QKV), writes K, V into column
``positions[b]`` and lets the one query attend to columns 0 … positions[b]:

    Attention(q_b, K_b, V_b) = softmax(q_b K_b[:p_b+1]ᵀ · scale) V_b[:p_b+1],  p_b = positions[b].

In onnxruntime this is the ``GroupQueryAttention`` contrib operator (``kv_num_heads`` =
``num_heads`` makes it plain multi-head attention; Q, K, V packed in one input; ``seqlens_k``
= positions). When the service binds one buffer as both the ``cache_*`` input and the
``present_*`` output, the operator writes the new column in place: a step copies no cache,
and rows can join, leave or be reordered by writing only the rows that change
(service/engine/translation/slots.py). Runs on CPU (float32, float16) and CUDA (float16).

Cross-attention reads each sentence's memory K, V (N, h, S, d_head) once for all its beams: the
rows' queries are gathered into (N, h, W, d_head) by ``sentence_rows`` (each sentence's rows side
by side, padded to the step's width W by repeating one), attend as one block per sentence, and go
back to their rows by ``beam_index`` (``folded_cross_attention``), as CTranslate2 does with its
beams. W is at least 2: onnxruntime's CPU MatMul takes another kernel for a single query row,
whose sums round differently, and a sentence's result must not depend on the step's width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

CONTRIB_DOMAIN = "com.microsoft"


class GroupQueryAttention(torch.autograd.Function):
    """One decoder step of cached self-attention: PyTorch semantics for tracing, and
    onnxruntime's ``GroupQueryAttention`` in the exported graph."""

    @staticmethod
    def forward(
        ctx: Any,
        qkv: Tensor,  # (B, 1, 3·h·d) packed Q, K, V of the new token
        cache_keys: Tensor,  # (B, h, L, d)
        cache_values: Tensor,
        seqlens: Tensor,  # (B,) int32: columns already written (= positions)
        total: Tensor,  # () int32: max(seqlens) + 1
        num_heads: int,
        scale: float,
    ) -> tuple[Tensor, Tensor, Tensor]:
        b, _, width = qkv.shape
        hidden = width // 3
        d = hidden // num_heads
        q, k, v = (t.reshape(b, num_heads, 1, d) for t in torch.split(qkv, hidden, dim=-1))
        rows, cols = torch.arange(b), seqlens.long()
        keys, values = cache_keys.clone(), cache_values.clone()
        keys[rows, :, cols] = k[:, :, 0]
        values[rows, :, cols] = v[:, :, 0]
        visible = torch.arange(keys.shape[2])[None, :] <= cols[:, None]  # (B, L)
        scores = (q @ keys.transpose(-2, -1)) * scale  # (B, h, 1, L)
        scores = scores.masked_fill(~visible[:, None, None, :], torch.finfo(scores.dtype).min)
        heads = scores.softmax(dim=-1) @ values  # (B, h, 1, d)
        return heads.transpose(1, 2).reshape(b, 1, hidden), keys, values

    @staticmethod
    def symbolic(
        g: Any,
        qkv: Any,
        cache_keys: Any,
        cache_values: Any,
        seqlens: Any,
        total: Any,
        num_heads: int,
        scale: float,
    ) -> Any:
        absent = g.op("prim::Constant")  # an omitted optional input ("")
        absent.setType(torch._C.OptionalType.ofTensor())
        heads, keys, values = g.op(
            f"{CONTRIB_DOMAIN}::GroupQueryAttention",
            qkv,
            absent,  # key, value: packed into qkv
            absent,
            cache_keys,
            cache_values,
            seqlens,
            total,
            num_heads_i=num_heads,
            kv_num_heads_i=num_heads,
            scale_f=scale,
            outputs=3,
        )
        keys.setType(cache_keys.type())  # the cache comes out as it went in
        values.setType(cache_values.type())
        heads.setType(qkv.type().with_sizes([None, 1, None]))
        return heads, keys, values


def fused_qkv(q: nn.Linear, k: nn.Linear, v: nn.Linear) -> nn.Linear:
    """One Linear computing [q(x), k(x), v(x)] (the weights stacked; a copy, same dtype)."""
    d_in, d_out = q.in_features, q.out_features
    fused = nn.Linear(d_in, 3 * d_out, bias=q.bias is not None, dtype=q.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
        if fused.bias is not None:
            assert q.bias is not None and k.bias is not None and v.bias is not None
            fused.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
    return fused


def cache_lengths(positions: Tensor) -> tuple[Tensor, Tensor]:
    """(B,) int64 positions → GroupQueryAttention's ``seqlens_k`` (B,) int32 and
    ``total_sequence_length`` () int32."""
    return positions.to(torch.int32), (positions.max() + 1).to(torch.int32)


_gqa = cast(Callable[..., tuple[Tensor, Tensor, Tensor]], GroupQueryAttention.apply)


def slot_self_attention(
    x: Tensor,
    qkv: nn.Module,
    cache: tuple[Tensor, Tensor],
    lengths: tuple[Tensor, Tensor],
    num_heads: int,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """(B, 1, d_model) → concatenated heads (B, 1, d_model) before the output projection, and
    the cache with the new column written. ``qkv``: the fused projection (``fused_qkv``)."""
    d_head = x.shape[-1] // num_heads
    heads, keys, values = _gqa(qkv(x), *cache, *lengths, num_heads, 1.0 / math.sqrt(d_head))
    return heads, (keys, values)


def folded_cross_attention(
    q: Tensor,
    memory: tuple[Tensor, Tensor, Tensor],
    fold: tuple[Tensor, Tensor],
    heads: tuple[int, int],
    scale: float,
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q Kᵀ · scale) V per sentence, its beams folded into Q.

    q: (B, 1, h·d) the rows' projected queries; memory: keys, values (N, h, S, d) one per
    sentence and their mask (N, 1, 1, S), True on real source tokens; fold: ``sentence_rows``
    (N, W) int64, the rows of each sentence, and ``beam_index`` (B,) int64, row b's place among
    the N·W folded queries; heads: (h, d) as Python ints, so that the reshapes are constants of
    the graph. → concatenated heads (B, 1, h·d) before the output projection, and weights
    (B, h, 1, S).
    """
    keys, values, mask = memory
    sentence_rows, beam_index = fold
    num_heads, d = heads
    folded = q.reshape(-1, num_heads, d)[sentence_rows].transpose(1, 2)  # (N, h, W, d)
    scores = (folded @ keys.transpose(-2, -1)) * scale  # (N, h, W, S)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    out = (weights @ values).transpose(1, 2).reshape(-1, num_heads * d)[beam_index]  # (B, h·d)
    row_weights = weights.transpose(1, 2).flatten(0, 1)[beam_index]  # (B, h, S)
    return out[:, None], row_weights[:, :, None]
