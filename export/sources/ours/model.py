"""The Transformer of "Attention is all you need" (Vaswani et al., 2017), equation by equation.

Post-LN encoder-decoder with multi-head scaled dot-product attention, position-wise ReLU
feed-forward networks, sinusoidal positions and one joint vocabulary whose embedding matrix is
shared by the encoder, the decoder and the output projection.

The decoder has two paths that compute the same function: ``decode`` over a whole target
prefix (training, reference) and the same call with ``past`` key/values, one step at a time
(inference; the ONNX decoder graph is exported from it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KeyValue = tuple[Tensor, Tensor]  # (B, h, T, d_k) each


@dataclass(frozen=True)
class TransformerConfig:
    """Everything needed to rebuild a model; stored inside every checkpoint."""

    vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    max_len: int = 256
    dropout: float = 0.1
    # On the attention weights (softmax output); 0: none, as the paper.
    attention_dropout: float = 0.0
    # Inside the feed-forward network, after the ReLU; None: ``dropout``, as before the option existed.
    activation_dropout: float | None = None
    # Pre-LN (Xiong et al., 2020; torch's ``norm_first``): each sublayer reads LayerNorm(x) and is
    # added to x, with one LayerNorm after each stack. Deep post-LN stacks learn slowly here (a
    # 6-layer encoder trailed 3+3 by far on Multi30k, docs/gpu-training.md); False: the paper's post-LN.
    norm_first: bool = False
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_model % 2:
            raise ValueError("d_model must be even for the sinusoidal encoding")

    @property
    def ffn_dropout(self) -> float:
        return self.dropout if self.activation_dropout is None else self.activation_dropout

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: nn.Module | None = None
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(QKᵀ / √d_k) V.

    q: (B, h, T_q, d_k); k, v: (B, h, T_k, d_k); mask: bool, broadcastable to
    (B, h, T_q, T_k), True where a query may attend to a key. Returns (output, weights); with
    ``dropout`` the output uses the dropped-out weights and the returned weights stay whole.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, h, T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # rows sum to 1 over keys
    used = weights if dropout is None else dropout(weights)
    return used @ v, weights  # (B, h, T_q, d_k), (B, h, T_q, T_k)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, …, head_h) W_o, head_i = Attention(QW_q^i, KW_k^i, VW_v^i).

    The per-head projections are stored side by side in one (d_model, d_model) matrix each.
    ``project_kv`` and ``attend`` are exposed separately so the decoder can cache keys/values.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        # None when off, so that training draws no random numbers for it (results as before).
        self.attention_dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.d_k = d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)

    def project_kv(self, x: Tensor) -> KeyValue:
        return self._split_heads(self.w_k(x)), self._split_heads(self.w_v(x))

    def attend(self, x_q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q = self._split_heads(self.w_q(x_q))  # (B, h, T_q, d_k)
        heads, weights = scaled_dot_product_attention(q, k, v, mask, self.attention_dropout)
        b, _, t, _ = heads.shape
        concat = heads.transpose(1, 2).reshape(b, t, self.n_heads * self.d_k)  # (B, T_q, d_model)
        return self.w_o(concat), weights

    def forward(self, x_q: Tensor, x_kv: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        k, v = self.project_kv(x_kv)
        return self.attend(x_q, k, v, mask)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.w_2(self.dropout(F.relu(self.w_1(x))))
        return out


class PositionalEncoding(nn.Module):
    """PE(k, 2i) = sin(k / 10000^(2i/d)), PE(k, 2i+1) = cos(k / 10000^(2i/d)), added to x."""

    pe: Tensor

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (L, 1)
        div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position / div)
        pe[:, 1::2] = torch.cos(position / div)
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: Tensor, offset: Tensor | int = 0) -> Tensor:
        t = x.size(1)
        return x + self.pe[offset : offset + t].to(x.dtype)  # (B, T, d_model)


class EncoderLayer(nn.Module):
    """u = LayerNorm(x + MultiHead(x, x, x)); z = LayerNorm(u + FFN(u)); pre-LN:
    u = x + MultiHead(LN(x)); z = u + FFN(LN(u))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.ffn_dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        out: Tensor
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, mask)[0])
            out = x + self.dropout(self.ffn(self.norm2(x)))
            return out
        x = self.norm1(x + self.dropout(self.self_attn(x, x, mask)[0]))
        out = self.norm2(x + self.dropout(self.ffn(x)))
        return out


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention and FFN, each as norm(x + sublayer(x)),
    or x + sublayer(norm(x)) pre-LN.

    ``past`` holds the self-attention keys/values of earlier positions: the new ones are
    appended and returned, so step-by-step decoding equals decoding the whole prefix.
    ``memory_kv`` are the encoder-decoder keys/values, computed once per source.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.ffn_dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.norm3 = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(
        self,
        y: Tensor,
        memory_kv: KeyValue,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        past: KeyValue | None = None,
    ) -> tuple[Tensor, KeyValue, Tensor]:
        h = self.norm1(y) if self.norm_first else y
        k, v = self.self_attn.project_kv(h)  # (B, h, T, d_k)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, h, T_past + T, d_k)
            v = torch.cat([past[1], v], dim=2)
        attended = self.dropout(self.self_attn.attend(h, k, v, self_mask)[0])
        if self.norm_first:
            y = y + attended
            cross, cross_weights = self.cross_attn.attend(self.norm2(y), *memory_kv, cross_mask)
            y = y + self.dropout(cross)
            return y + self.dropout(self.ffn(self.norm3(y))), (k, v), cross_weights
        y = self.norm1(y + attended)
        cross, cross_weights = self.cross_attn.attend(y, *memory_kv, cross_mask)
        y = self.norm2(y + self.dropout(cross))
        return self.norm3(y + self.dropout(self.ffn(y))), (k, v), cross_weights


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, T) tokens → (B, 1, 1, T) bool, True on real (non-pad) keys."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(t_q: int, t_k: int, device: torch.device) -> Tensor:
    """(T_q, T_k) bool, True where query i (at absolute position t_k - t_q + i) may see key j."""
    offset = t_k - t_q
    q_pos = torch.arange(t_q, device=device)[:, None] + offset
    return torch.arange(t_k, device=device)[None, :] <= q_pos


class Transformer(nn.Module):
    """Encoder-decoder Transformer with tied embeddings, scaled by √d_model."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.pos = PositionalEncoding(cfg.d_model, cfg.max_len)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        # Pre-LN's last norms; Identity (no weights, checkpoints unchanged) for post-LN.
        self.encoder_norm: nn.Module = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.decoder_norm: nn.Module = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and not name.startswith("embed"):
                nn.init.xavier_uniform_(p)
        # Tied with the output projection: N(0, d^-1/2) keeps initial logits at unit scale.
        nn.init.normal_(self.embed.weight, mean=0.0, std=self.cfg.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[self.cfg.pad_id].zero_()

    def _embed(self, tokens: Tensor, offset: Tensor | int = 0) -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model)  # (B, T, d_model)
        out: Tensor = self.dropout(self.pos(x, offset))
        return out

    def encode(self, src: Tensor) -> Tensor:
        """(B, S) source ids → (B, S, d_model) memory."""
        mask = padding_mask(src, self.cfg.pad_id)
        x = self._embed(src)
        for layer in self.encoder:
            x = layer(x, mask)
        out: Tensor = self.encoder_norm(x)
        return out

    def memory_kv(self, memory: Tensor) -> list[KeyValue]:
        """Encoder-decoder keys/values of every decoder layer, computed once per source."""
        layers = cast(list[DecoderLayer], list(self.decoder))
        return [layer.cross_attn.project_kv(memory) for layer in layers]

    def decode(
        self,
        tgt: Tensor,
        memory_kv: list[KeyValue],
        src_mask: Tensor,
        past: list[KeyValue] | None = None,
    ) -> tuple[Tensor, list[KeyValue], Tensor]:
        """Target ids (B, T) → logits (B, T, V), the grown self-attention cache, and the last
        layer's cross-attention weights averaged over heads (B, T, S).

        src_mask: (B, 1, 1, S) from ``padding_mask``. With ``past`` the first new token sits at
        position T_past; the causal mask then only hides positions after each query.
        """
        past_len = 0 if past is None else past[0][0].size(2)
        t = tgt.size(1)
        self_mask = causal_mask(t, past_len + t, tgt.device)  # (T, T_past + T)
        y = self._embed(tgt, offset=past_len)
        present: list[KeyValue] = []
        cross_weights = torch.empty(0)
        for i, layer in enumerate(self.decoder):
            y, kv, cross_weights = layer(
                y, memory_kv[i], self_mask, src_mask, None if past is None else past[i]
            )
            present.append(kv)
        logits = self.decoder_norm(y) @ self.embed.weight.t()  # (B, T, V), tied output projection
        return logits, present, cross_weights.mean(dim=1)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for target input ids (B, T)."""
        memory = self.encode(src)
        return self.decode(tgt, self.memory_kv(memory), padding_mask(src, self.cfg.pad_id))[0]
