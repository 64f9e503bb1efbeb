"""Import a local Hugging Face MarianMTModel directory into the project's translation ONNX layout.

The wrappers re-implement Marian's forward pass around the loaded modules, step by step, so the
graphs have exactly the I/O of our own model's (see ``export.graphs.translation_layout``). Marian
specifics handled here: ``final_logits_bias``, sinusoidal positions with sin and cos halves (the
loaded ``embed_positions`` table), ``scale_embedding``, ``activation_function``, the decoder
start token being ``<pad>``, and the ``bad_words_ids`` that keep ``generate`` from ever emitting
``<pad>`` (baked into the decoder graph so the service search needs no logits processors).

The tokenizer the service needs comes from export/sources/marian/tokenizer.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from export.sources import (
    TranslationSource,
    generation_length_penalty,
    languages_from_name,
)
from export.sources.decoder_step import DecoderStep, KeyValue, Memory, stack_kv
from export.sources.hf_seq2seq import (
    EncoderGraph,
    Seq2SeqReference,
    attend,
    cached_self_kv,
    decoder_layers,
    hf_dimensions,
    hf_model_type,
    load_eager,
    project_kv,
    weight_files,
)
from export.sources.marian import MarianImportError
from export.sources.marian.tokenizer import marian_tokenizer
from service.artefacts import SpecialIds


def is_marian_dir(path: Path) -> bool:
    return hf_model_type(path) == "marian"


# --- the graphs ---------------------------------------------------------------------------------


def _ffn(layer: Any, x: Tensor) -> Tensor:
    out: Tensor = layer.final_layer_norm(x + layer.fc2(layer.activation_fn(layer.fc1(x))))
    return out


class MarianEncoderGraph(EncoderGraph):
    """input_ids → every decoder layer's cross-attention K/V (post-LN encoder, as Marian)."""

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        enc, dec = self.model.model.encoder, self.model.model.decoder
        x = enc.embed_tokens(input_ids) * enc.embed_scale
        x = x + enc.embed_positions.weight[: input_ids.shape[1]].to(x.dtype)
        mask = (input_ids != self.pad_id)[:, None, None, :]
        for layer in enc.layers:
            attn, _ = attend(layer.self_attn, x, *project_kv(layer.self_attn, x), mask)
            x = _ffn(layer, layer.self_attn_layer_norm(x + attn))
        return stack_kv([project_kv(layer.encoder_attn, x) for layer in dec.layers])


class MarianDecoderStepGraph(DecoderStep):
    """One cached Marian decoder step (``decoder_step.DecoderStep``).

    ``suppressed`` token ids (Marian's ``bad_words_ids``, i.e. ``<pad>``) get the lowest finite
    logit, so they are never chosen, as in ``generate``. With ``slots`` (layout per_layer_kv_slots)
    the layers' own projections, norms and feed-forward run around the slot cache and the memory
    held once per sentence.
    """

    bias: Tensor
    model: Any  # a MarianMTModel (registered as a submodule)

    def __init__(self, model: Any, suppressed: Sequence[int], slots: bool = False) -> None:
        layers, heads, projections = decoder_layers(model, slots)
        super().__init__(len(layers), heads, projections)
        self.model = model
        self.layers = layers
        bias = model.final_logits_bias.detach().float().clone().reshape(-1)
        bias[list(suppressed)] = torch.finfo(torch.float32).min
        self.register_buffer("bias", bias, persistent=False)  # float32 even in an fp16 graph

    def position_table(self) -> Tensor:
        table: Tensor = self.model.model.decoder.embed_positions.weight
        return table

    def embed(self, input_ids: Tensor, pe: Tensor) -> Tensor:
        dec = self.model.model.decoder
        x: Tensor = dec.embed_tokens(input_ids) * dec.embed_scale
        return x + pe.to(x.dtype)

    def layer_step(
        self, i: int, x: Tensor, past: KeyValue, self_mask: Tensor, memory: Memory
    ) -> tuple[Tensor, KeyValue, Tensor]:
        layer = self.layers[i]
        k, v = cached_self_kv(layer.self_attn, x, past)
        attn, _ = attend(layer.self_attn, x, k, v, self_mask)  # one query: no causal mask
        x = layer.self_attn_layer_norm(x + attn)
        cross, cross_weights = attend(layer.encoder_attn, x, *memory)
        return _ffn(layer, layer.encoder_attn_layer_norm(x + cross)), (k, v), cross_weights

    def after_self_attention(self, i: int, x: Tensor, heads: Tensor) -> Tensor:
        attn = self.layers[i].self_attn
        out: Tensor = self.layers[i].self_attn_layer_norm(x + attn.out_proj(heads))
        return out

    def cross_query(self, i: int, x: Tensor) -> tuple[Tensor, tuple[int, int], float]:
        attn = self.layers[i].encoder_attn
        return attn.q_proj(x), (attn.num_heads, attn.head_dim), float(attn.scaling)

    def after_cross_attention(self, i: int, x: Tensor, heads: Tensor) -> Tensor:
        layer = self.layers[i]
        return _ffn(layer, layer.encoder_attn_layer_norm(x + layer.encoder_attn.out_proj(heads)))

    def logits(self, x: Tensor) -> Tensor:
        out: Tensor = self.model.lm_head(x).float() + self.bias
        return out


# --- loading -------------------------------------------------------------------------------------


def _suppressed_ids(model: Any) -> list[int]:
    """Single-token ``bad_words_ids`` (Marian: [[pad]]) from the generation config or config."""
    bad = getattr(model.generation_config, "bad_words_ids", None) or getattr(
        model.config, "bad_words_ids", None
    )
    return sorted({ids[0] for ids in bad or [] if len(ids) == 1})


def _languages(directory: Path, name: str) -> tuple[list[str], list[str]]:
    cfg_path = directory / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    if cfg.get("source_lang") and cfg.get("target_lang"):
        return [str(cfg["source_lang"])], [str(cfg["target_lang"])]
    return languages_from_name(name)


def _reference_encoder(directory: Path) -> Any:
    """MarianTokenizer's own encoding, when its files are there, to check the converted tokenizer."""
    if not (directory / "source.spm").is_file():
        return None
    from transformers import MarianTokenizer

    hf_tok = MarianTokenizer.from_pretrained(str(directory))

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [list(ids) for ids in hf_tok(list(texts))["input_ids"]]

    return encode


def load_marian(directory: Path, name: str | None = None) -> TranslationSource:
    """A local MarianMTModel directory (config.json, weights, tokenizer files) as a source."""
    from transformers import MarianMTModel

    model = load_eager(MarianMTModel, directory)
    cfg = model.config
    pad_id, eos_id = int(cfg.pad_token_id), int(cfg.eos_token_id)
    start_id = int(cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else pad_id)
    unk_id = _unk_id(directory)
    tokenizer = marian_tokenizer(directory)
    suppressed = _suppressed_ids(model)
    name = name or directory.name
    src_langs, tgt_langs = _languages(directory, name)

    tokenizer_file = directory / "tokenizer.json"

    def build(dtype: torch.dtype, slots: bool) -> tuple[nn.Module, nn.Module]:
        m = load_eager(MarianMTModel, directory, dtype)
        return MarianEncoderGraph(m, pad_id).eval(), MarianDecoderStepGraph(m, suppressed, slots).eval()

    return TranslationSource(
        kind="marian",
        name=name,
        path=directory,
        weight_files=weight_files(directory, MarianImportError),
        tokenizer=tokenizer,
        special=SpecialIds(pad=pad_id, bos=start_id, eos=eos_id, unk=unk_id),
        **hf_dimensions(model),
        source_languages=src_langs,
        target_languages=tgt_langs,
        build_graphs=build,
        reference=Seq2SeqReference(model, pad_id, eos_id, suppressed=suppressed),
        reference_encode=_reference_encoder(directory),
        tokenizer_file=tokenizer_file if tokenizer_file.is_file() else None,
        length_penalty=generation_length_penalty(directory),
    )


def _unk_id(directory: Path) -> int | None:
    vocab_path = directory / "vocab.json"
    if vocab_path.is_file():
        unk = json.loads(vocab_path.read_text(encoding="utf-8")).get("<unk>")
        return None if unk is None else int(unk)
    tok_path = directory / "tokenizer.json"
    return Tokenizer.from_file(str(tok_path)).token_to_id("<unk>") if tok_path.is_file() else None
