"""Import a local Hugging Face M2M100ForConditionalGeneration directory (M2M-100, NLLB-200) into
the project's translation ONNX layout.

As for Marian (export/sources/marian/source.py), the wrappers re-run the model's forward pass
around its loaded modules so the graphs have our I/O. M2M-100 specifics: pre-LayerNorm blocks
and the final encoder/decoder LayerNorms, embeddings scaled inside ``embed_tokens``
(M2M100ScaledWordEmbedding), sinusoidal positions whose row for position p is ``p + pad + 1``
(a pad token gets the zero row ``pad``), no ``final_logits_bias``, ``</s>`` as the decoder start,
the source language's token before the text and the target language's forced as the first
output token (``forced_bos_token_id``; the engine forces it, service/engine/translation/search.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from export.sources import TranslationSource, generation_length_penalty
from export.sources.decoder_step import DecoderStep, KeyValue, Memory, stack_kv
from export.sources.hf_seq2seq import (
    EncoderGraph,
    Seq2SeqReference,
    attend,
    cached_self_kv,
    decoder_layers,
    generation_early_stopping,
    hf_dimensions,
    hf_model_type,
    load_eager,
    project_kv,
    weight_files,
)
from export.sources.m2m100 import M2M100ImportError
from export.sources.m2m100.tokenizer import (
    load_tokenizers,
    reference_encoder,
    tokenizer_config,
    with_source_token,
)
from service.artefacts import SpecialIds
from service.languages_nllb import NLLB_200

_M2M100_TOKEN = re.compile(r"__[a-z]{2,3}__")


def is_m2m100_dir(path: Path) -> bool:
    return hf_model_type(path) == "m2m_100"


def _ffn(layer: Any, x: Tensor) -> Tensor:
    out: Tensor = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
    return out


def _positions(embed_positions: Any, pad_id: int) -> Tensor:
    """The sinusoidal rows of positions 0, 1, … (transformers' offset: pad + 1)."""
    table: Tensor = embed_positions.weights[pad_id + 1 :]
    return table


class M2M100EncoderGraph(EncoderGraph):
    """input_ids → every decoder layer's cross-attention K/V (pre-LN encoder, final LayerNorm)."""

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        enc, dec = self.model.model.encoder, self.model.model.decoder
        x = enc.embed_tokens(input_ids)
        pe = _positions(enc.embed_positions, self.pad_id)[: input_ids.shape[1]].to(x.dtype)
        keep = input_ids != self.pad_id
        x = x + pe * keep[..., None].to(x.dtype)  # transformers gives <pad> the zero row
        mask = keep[:, None, None, :]
        for layer in enc.layers:
            h = layer.self_attn_layer_norm(x)
            attn, _ = attend(layer.self_attn, h, *project_kv(layer.self_attn, h), mask)
            x = _ffn(layer, x + attn)
        x = enc.layer_norm(x)
        return stack_kv([project_kv(layer.encoder_attn, x) for layer in dec.layers])


class M2M100DecoderStepGraph(DecoderStep):
    """One cached M2M-100 decoder step (``decoder_step.DecoderStep``), pre-LN layers."""

    model: Any  # an M2M100ForConditionalGeneration (registered as a submodule)

    def __init__(self, model: Any, pad_id: int, slots: bool = False) -> None:
        layers, heads, projections = decoder_layers(model, slots)
        super().__init__(len(layers), heads, projections)
        self.model = model
        self.layers = layers
        self.pad_id = pad_id

    def position_table(self) -> Tensor:
        return _positions(self.model.model.decoder.embed_positions, self.pad_id)

    def embed(self, input_ids: Tensor, pe: Tensor) -> Tensor:
        x: Tensor = self.model.model.decoder.embed_tokens(input_ids)
        is_pad = (input_ids == self.pad_id)[..., None]  # transformers gives <pad> the zero row
        return x + torch.where(is_pad, torch.zeros_like(pe), pe).to(x.dtype)

    def layer_step(
        self, i: int, x: Tensor, past: KeyValue, self_mask: Tensor, memory: Memory
    ) -> tuple[Tensor, KeyValue, Tensor]:
        layer = self.layers[i]
        h = layer.self_attn_layer_norm(x)
        k, v = cached_self_kv(layer.self_attn, h, past)
        attn, _ = attend(layer.self_attn, h, k, v, self_mask)  # one query: no causal mask
        x = x + attn
        cross, cross_weights = attend(layer.encoder_attn, layer.encoder_attn_layer_norm(x), *memory)
        return _ffn(layer, x + cross), (k, v), cross_weights

    def self_attention_input(self, i: int, x: Tensor) -> Tensor:
        out: Tensor = self.layers[i].self_attn_layer_norm(x)
        return out

    def after_self_attention(self, i: int, x: Tensor, heads: Tensor) -> Tensor:
        out: Tensor = x + self.layers[i].self_attn.out_proj(heads)
        return out

    def cross_query(self, i: int, x: Tensor) -> tuple[Tensor, tuple[int, int], float]:
        layer = self.layers[i]
        attn = layer.encoder_attn
        q = attn.q_proj(layer.encoder_attn_layer_norm(x))
        return q, (attn.num_heads, attn.head_dim), float(attn.scaling)

    def after_cross_attention(self, i: int, x: Tensor, heads: Tensor) -> Tensor:
        layer = self.layers[i]
        return _ffn(layer, x + layer.encoder_attn.out_proj(heads))

    def logits(self, x: Tensor) -> Tensor:
        out: Tensor = self.model.lm_head(self.model.model.decoder.layer_norm(x)).float()
        return out


# --- the tokenizer and languages -----------------------------------------------------------------


def language_code(token: str) -> str:
    """A language token as users name the language: M2M-100's ``__de__`` → ``de``; NLLB's codes
    (``deu_Latn``) as they are."""
    return token.strip("_")


def language_tokens(tok: Tokenizer) -> dict[str, int]:
    """Every language token of the tokenizer by its code (``language_code``): M2M-100's
    ``__xx__``, NLLB's ``deu_Latn``-style codes, in id order."""
    found = {
        token: int(i)
        for token, i in sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
        if _M2M100_TOKEN.fullmatch(token) or token in NLLB_200
    }
    return {language_code(token): i for token, i in found.items()}


def _reference_pair(tok_cfg: dict[str, Any], codes: list[str]) -> tuple[str, str]:
    """The pair the export verifies, listed first (the served default): tokenizer_config.json's
    ``src_lang`` and ``tgt_lang``, else English into German, else the first two languages."""
    named = (tok_cfg.get("src_lang"), tok_cfg.get("tgt_lang"))
    if all(named):
        return str(named[0]), str(named[1])
    for pair in (("en", "de"), ("eng_Latn", "deu_Latn")):
        if all(c in codes for c in pair):
            return pair
    if len(codes) < 2:
        raise M2M100ImportError(f"the tokenizer has {len(codes)} language tokens; a pair needs two")
    return codes[0], codes[1]


def _language_token(tok: Tokenizer, code: str) -> tuple[str, int]:
    for token in (code, f"__{code}__"):
        token_id = tok.token_to_id(token)
        if token_id is not None:
            return token, int(token_id)
    raise M2M100ImportError(f"no language token for {code!r} in the tokenizer")


# --- loading -------------------------------------------------------------------------------------


def load_m2m100(directory: Path, name: str | None = None) -> TranslationSource:
    """A local M2M100ForConditionalGeneration directory (config.json, weights, tokenizer.json or
    NLLB's SentencePiece model: tokenizer.py) as a source of every language its tokenizer has a
    token of; the pair tokenizer_config.json names (``src_lang``, ``tgt_lang``) is the one
    verified and the default."""
    from transformers import M2M100ForConditionalGeneration

    model = load_eager(M2M100ForConditionalGeneration, directory)
    cfg = model.config
    pad_id, eos_id = int(cfg.pad_token_id), int(cfg.eos_token_id)
    start_id = int(cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else eos_id)
    tok_cfg = tokenizer_config(directory)
    plain, hf_tokenizer = load_tokenizers(directory, tok_cfg)
    tokens = language_tokens(plain)
    source_code, target_code = _reference_pair(tok_cfg, list(tokens))
    source_token, _ = _language_token(plain, source_code)
    target_token, target_id = _language_token(plain, target_code)
    source, target = language_code(source_token), language_code(target_token)

    def build(dtype: torch.dtype, slots: bool) -> tuple[nn.Module, nn.Module]:
        m = load_eager(M2M100ForConditionalGeneration, directory, dtype)
        return M2M100EncoderGraph(m, pad_id).eval(), M2M100DecoderStepGraph(m, pad_id, slots).eval()

    return TranslationSource(
        kind="m2m100",
        name=name or directory.name,
        path=directory,
        weight_files=weight_files(directory, M2M100ImportError),
        tokenizer=with_source_token(plain, source_token, bool(tok_cfg.get("legacy_behaviour"))),
        reference_encode=None if hf_tokenizer is None else reference_encoder(hf_tokenizer, source_token),
        special=SpecialIds(pad=pad_id, bos=start_id, eos=eos_id, unk=plain.token_to_id("<unk>")),
        **hf_dimensions(model),
        # every language both ways, the verified pair first (the engine's default target)
        source_languages=[source, *(c for c in tokens if c != source)],
        target_languages=[target, *(c for c in tokens if c != target)],
        build_graphs=build,
        reference=Seq2SeqReference(model, pad_id, eos_id, forced_first=target_id),
        length_penalty=generation_length_penalty(directory),
        early_stopping=generation_early_stopping(model),
        language_tokens=tokens,
    )
