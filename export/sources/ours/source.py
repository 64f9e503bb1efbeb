"""Our checkpoint as a translation source: the Transformer wrapped into the translation ONNX
layout (export/graphs/translation_layout.py) and its PyTorch reference.

``load_ours`` turns a checkpoint of ours into a :class:`~export.sources.TranslationSource`, as
``export.sources.marian.source.load_marian`` does for Marian: ``EncoderGraph`` and ``DecoderStepGraph``
call the model's own layers (so the graphs compute what ``Transformer.decode`` computes), and
``OursReference`` decodes with ``TorchDecoder`` (export/sources/ours/translate.py) as trained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from export.sources import (
    IncrementalDecoder,
    TranslationSource,
    generation_length_penalty,
    languages_from_name,
)
from export.sources.cached_attention import (
    cache_lengths,
    folded_cross_attention,
    fused_qkv,
    slot_self_attention,
)
from export.sources.decoder_step import stack_kv, step_outputs, step_positions
from export.sources.ours.checkpoint import load_checkpoint, read_config
from export.sources.ours.data import pad
from export.sources.ours.model import DecoderLayer, Transformer
from export.sources.ours.translate import TorchDecoder
from service.artefacts import DecoderLayout, SpecialIds
from service.engine.search import beam_search


class EncoderGraph(nn.Module):
    """Our model's encoder plus every decoder layer's cross-attention K/V projection."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        return stack_kv(self.model.memory_kv(self.model.encode(input_ids)))


class DecoderStepGraph(nn.Module):
    """One cached decoder step of our model, with positions and masks from ``step_positions``.

    It calls the model's own layers, so numerics equal ``Transformer.decode`` with ``past``; only
    the glue differs: the single new query needs no causal mask, only the padding mask of rows
    that joined a running batch later (layout per_layer_kv_positions). With ``slots`` (layout
    per_layer_kv_slots) the past is a slot cache written in place (export/sources/cached_attention.py),
    then each layer goes on with its own ``after_self_attention``.
    """

    def __init__(self, model: Transformer, slots: bool = False) -> None:
        super().__init__()
        self.model = model
        layers = cast(list[DecoderLayer], list(model.decoder))
        attns = [layer.self_attn for layer in layers]
        self.qkv = nn.ModuleList(fused_qkv(a.w_q, a.w_k, a.w_v) for a in attns) if slots else None

    def forward(
        self,
        input_ids: Tensor,
        source_mask: Tensor,
        memory_keys: Tensor,
        memory_values: Tensor,
        past_keys: Tensor,
        past_values: Tensor,
        positions: Tensor | None = None,
        sentence_rows: Tensor | None = None,
        beam_index: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        m = self.model
        cross_mask = (source_mask != 0)[:, None, None, :]  # (B, 1, 1, S); slots: (N, 1, 1, S)
        if self.qkv is not None:
            assert positions is not None and sentence_rows is not None and beam_index is not None
            memory, fold = (memory_keys, memory_values, cross_mask), (sentence_rows, beam_index)
            return self._slot_step(input_ids, memory, fold, (past_keys, past_values), positions)
        pe, self_mask = step_positions(past_keys, positions, m.pos.pe)
        y = m.embed(input_ids) * math.sqrt(m.cfg.d_model) + pe.to(memory_keys.dtype)
        presents: list[tuple[Tensor, Tensor]] = []
        cross_weights = memory_keys.new_zeros(0)
        for i, layer in enumerate(m.decoder):
            y, kv, cross_weights = layer(
                y, (memory_keys[i], memory_values[i]), self_mask, cross_mask, (past_keys[i], past_values[i])
            )
            presents.append(kv)
        logits = y[:, 0] @ m.embed.weight.t()  # (B, V), tied output projection
        return step_outputs(logits, presents, cross_weights)

    def _slot_step(
        self,
        input_ids: Tensor,
        memory: tuple[Tensor, Tensor, Tensor],
        fold: tuple[Tensor, Tensor],
        cache: tuple[Tensor, Tensor],
        positions: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Each layer as ``DecoderLayer``: u = norm1(y + SelfAttn(y)) over the slot cache,
        z = norm2(u + CrossAttn(u, memory)) with the beams folded onto their sentence's memory,
        norm3(z + FFN(z)) (eval: no dropout)."""
        m = self.model
        assert self.qkv is not None
        memory_keys, memory_values, cross_mask = memory
        pe = m.pos.pe[positions][:, None, :]  # (B, 1, d): row b's token sits at positions[b]
        y = m.embed(input_ids) * math.sqrt(m.cfg.d_model) + pe.to(memory_keys.dtype)
        lengths = cache_lengths(positions)
        presents: list[tuple[Tensor, Tensor]] = []
        cross_weights = memory_keys.new_zeros(0)
        layers = cast(list[DecoderLayer], list(m.decoder))
        for i, (layer, qkv) in enumerate(zip(layers, self.qkv, strict=True)):
            heads, kv = slot_self_attention(y, qkv, (cache[0][i], cache[1][i]), lengths, m.cfg.n_heads)
            presents.append(kv)
            y = layer.norm1(y + layer.self_attn.w_o(heads))
            cross = layer.cross_attn
            memory_kv = (memory_keys[i], memory_values[i], cross_mask)
            heads, cross_weights = folded_cross_attention(
                cross.w_q(y), memory_kv, fold, (cross.n_heads, cross.d_k), 1.0 / math.sqrt(cross.d_k)
            )
            y = layer.norm2(y + cross.w_o(heads))
            y = layer.norm3(y + layer.ffn(y))
        logits = y[:, 0] @ m.embed.weight.t()  # (B, V), tied output projection
        return step_outputs(logits, presents, cross_weights)


class OursReference:
    """The PyTorch reference for our checkpoints: ``Transformer`` and ``TorchDecoder`` as trained."""

    def __init__(self, model: Transformer) -> None:
        self.model = model

    @torch.no_grad()
    def memory_kv(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return stack_kv(self.model.memory_kv(self.model.encode(src)))

    def decoder(self, src: Tensor) -> IncrementalDecoder:
        return TorchDecoder(self.model, src, with_attention=True)

    @torch.no_grad()
    def greedy(self, src_ids: Sequence[Sequence[int]], max_lens: Sequence[int]) -> list[list[int]]:
        """``TorchDecoder`` under the project's search with beam 1, in length-sorted batches of 64."""
        cfg = self.model.cfg
        order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
        out: list[list[int]] = [[] for _ in src_ids]
        for start in range(0, len(order), 64):
            chunk = order[start : start + 64]
            src = pad([src_ids[i] for i in chunk], cfg.pad_id)
            hyps = beam_search(
                TorchDecoder(self.model, src),
                len(chunk),
                beam_size=1,
                max_len=[max_lens[i] for i in chunk],
                bos_id=cfg.bos_id,
                eos_id=cfg.eos_id,
            )
            for i, h in zip(chunk, hyps, strict=True):
                out[i] = h[0].tokens
        return out


def load_ours(source: Path, name: str | None = None) -> TranslationSource:
    """A checkpoint of ours: ``model.safetensors`` (or any ``.safetensors`` of ours) with
    ``tokenizer.json`` beside it. The name defaults to the checkpoint's directory name."""
    path = source / "model.safetensors" if source.is_dir() else source
    tokenizer_path = path.parent / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"{tokenizer_path}: the checkpoint's tokenizer is missing")
    cfg = read_config(path)
    model = load_checkpoint(path)
    name = name or path.parent.name
    src_langs, tgt_langs = languages_from_name(name)

    def build(dtype: torch.dtype, layout: DecoderLayout) -> tuple[nn.Module, nn.Module]:
        m = load_checkpoint(path).to(dtype)  # a fresh copy: the reference stays fp32
        return EncoderGraph(m).eval(), DecoderStepGraph(m, layout == "per_layer_kv_slots").eval()

    return TranslationSource(
        kind="ours",
        name=name,
        path=path,
        weight_files=(path,),
        tokenizer=Tokenizer.from_file(str(tokenizer_path)),
        special=SpecialIds(pad=cfg.pad_id, bos=cfg.bos_id, eos=cfg.eos_id, unk=cfg.unk_id),
        vocab_size=cfg.vocab_size,
        n_layers=cfg.n_decoder_layers,
        n_heads=cfg.n_heads,
        d_head=cfg.d_k,
        max_source_len=cfg.max_len,
        max_target_len=cfg.max_len,
        source_languages=src_langs,
        target_languages=tgt_langs,
        build_graphs=build,
        reference=OursReference(model),
        tokenizer_file=tokenizer_path,
        length_penalty=generation_length_penalty(path.parent),
    )
