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
from export.sources.decoder_step import DecoderStep, KeyValue, Memory, stack_kv
from export.sources.ours.checkpoint import load_checkpoint, read_config
from export.sources.ours.data import pad
from export.sources.ours.model import DecoderLayer, Transformer
from export.sources.ours.translate import TorchDecoder
from service.artefacts import SpecialIds
from service.engine.translation.search_loop import beam_search


class EncoderGraph(nn.Module):
    """Our model's encoder plus every decoder layer's cross-attention K/V projection."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        return stack_kv(self.model.memory_kv(self.model.encode(input_ids)))


class DecoderStepGraph(DecoderStep):
    """One cached decoder step of our model (``decoder_step.DecoderStep``).

    It calls the model's own layers, so numerics equal ``Transformer.decode`` with ``past``; only
    the glue differs: the single new query needs no causal mask, only the padding mask of rows
    that joined a running batch later. With ``slots`` (layout per_layer_kv_slots) the past is a
    slot cache written in place and the memory one per sentence, around the layer's own
    projections, norms and feed-forward (eval: no dropout).
    """

    def __init__(self, model: Transformer, slots: bool = False) -> None:
        layers = cast(list[DecoderLayer], list(model.decoder))
        projections = [(a.w_q, a.w_k, a.w_v) for a in (layer.self_attn for layer in layers)]
        super().__init__(len(layers), model.cfg.n_heads, projections if slots else None)
        self.model = model
        self.layers = layers
        self.pre_ln = model.cfg.norm_first

    def position_table(self) -> Tensor:
        table: Tensor = self.model.pos.pe
        return table

    def embed(self, input_ids: Tensor, pe: Tensor) -> Tensor:
        m = self.model
        x: Tensor = m.embed(input_ids) * math.sqrt(m.cfg.d_model)
        return x + pe.to(x.dtype)

    def layer_step(
        self, i: int, x: Tensor, past: KeyValue, self_mask: Tensor, memory: Memory
    ) -> tuple[Tensor, KeyValue, Tensor]:
        keys, values, cross_mask = memory
        out: tuple[Tensor, KeyValue, Tensor] = self.layers[i](x, (keys, values), self_mask, cross_mask, past)
        return out

    def self_attention_input(self, i: int, x: Tensor) -> Tensor:
        out: Tensor = self.layers[i].norm1(x) if self.pre_ln else x
        return out

    def after_self_attention(self, i: int, x: Tensor, heads: Tensor) -> Tensor:
        layer = self.layers[i]
        out: Tensor = x + layer.self_attn.w_o(heads)
        return out if self.pre_ln else layer.norm1(out)

    def cross_query(self, i: int, x: Tensor) -> tuple[Tensor, tuple[int, int], float]:
        layer = self.layers[i]
        cross = layer.cross_attn
        q = cross.w_q(layer.norm2(x) if self.pre_ln else x)
        return q, (cross.n_heads, cross.d_k), 1.0 / math.sqrt(cross.d_k)

    def after_cross_attention(self, i: int, x: Tensor, heads: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.cross_attn.w_o(heads)
        if self.pre_ln:
            out: Tensor = x + layer.ffn(layer.norm3(x))
            return out
        x = layer.norm2(x)
        out = layer.norm3(x + layer.ffn(x))
        return out

    def logits(self, x: Tensor) -> Tensor:
        out: Tensor = self.model.decoder_norm(x) @ self.model.embed.weight.t()  # (B, V), tied projection
        return out


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

    def build(dtype: torch.dtype, slots: bool) -> tuple[nn.Module, nn.Module]:
        m = load_checkpoint(path).to(dtype)  # a fresh copy: the reference stays fp32
        return EncoderGraph(m).eval(), DecoderStepGraph(m, slots).eval()

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
