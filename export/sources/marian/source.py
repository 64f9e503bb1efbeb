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

import numpy as np
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
from export.sources.marian import MarianImportError
from export.sources.marian.tokenizer import marian_tokenizer
from service.artefacts import DecoderLayout, SpecialIds


def is_marian_dir(path: Path) -> bool:
    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return False
    return bool(json.loads(config.read_text(encoding="utf-8")).get("model_type") == "marian")


# --- the graphs ---------------------------------------------------------------------------------


def _split_heads(x: Tensor, attn: Any) -> Tensor:
    b, t, _ = x.shape
    return x.view(b, t, attn.num_heads, attn.head_dim).transpose(1, 2)  # (B, h, T, d)


def _project_kv(attn: Any, x: Tensor) -> tuple[Tensor, Tensor]:
    return _split_heads(attn.k_proj(x), attn), _split_heads(attn.v_proj(x), attn)


def _attend(attn: Any, x_q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """MarianAttention's eager path: softmax(q kᵀ · scaling + mask) v, then out_proj."""
    q = _split_heads(attn.q_proj(x_q), attn)
    scores = (q @ k.transpose(-2, -1)) * attn.scaling
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    heads = weights @ v  # (B, h, T_q, d)
    b, _, t, _ = heads.shape
    return attn.out_proj(heads.transpose(1, 2).reshape(b, t, -1)), weights


def _ffn(layer: Any, x: Tensor) -> Tensor:
    out: Tensor = layer.final_layer_norm(x + layer.fc2(layer.activation_fn(layer.fc1(x))))
    return out


class MarianEncoderGraph(nn.Module):
    """input_ids → every decoder layer's cross-attention K/V (post-LN encoder, as Marian)."""

    model: Any  # a MarianMTModel (registered as a submodule)

    def __init__(self, model: Any, pad_id: int) -> None:
        super().__init__()
        self.model = model
        self.pad_id = pad_id

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        enc, dec = self.model.model.encoder, self.model.model.decoder
        x = enc.embed_tokens(input_ids) * enc.embed_scale
        x = x + enc.embed_positions.weight[: input_ids.shape[1]].to(x.dtype)
        mask = (input_ids != self.pad_id)[:, None, None, :]
        for layer in enc.layers:
            attn, _ = _attend(layer.self_attn, x, *_project_kv(layer.self_attn, x), mask)
            x = _ffn(layer, layer.self_attn_layer_norm(x + attn))
        return stack_kv([_project_kv(layer.encoder_attn, x) for layer in dec.layers])


class MarianDecoderStepGraph(nn.Module):
    """One cached Marian decoder step; positions and self-attention mask from ``step_positions``.

    ``suppressed`` token ids (Marian's ``bad_words_ids``, i.e. ``<pad>``) get the lowest finite
    logit, so they are never chosen, as in ``generate``. With ``slots`` (layout per_layer_kv_slots)
    self-attention runs on the slot cache, in place, and cross-attention on the memory of each
    sentence, its beams folded together (export/sources/cached_attention.py).
    """

    bias: Tensor
    model: Any  # a MarianMTModel (registered as a submodule)

    def __init__(self, model: Any, suppressed: Sequence[int], slots: bool = False) -> None:
        super().__init__()
        self.model = model
        attns = [layer.self_attn for layer in model.model.decoder.layers]
        self.qkv = nn.ModuleList(fused_qkv(a.q_proj, a.k_proj, a.v_proj) for a in attns) if slots else None
        bias = model.final_logits_bias.detach().float().clone().reshape(-1)
        bias[list(suppressed)] = torch.finfo(torch.float32).min
        self.register_buffer("bias", bias, persistent=False)  # float32 even in an fp16 graph

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
        dec = self.model.model.decoder
        if self.qkv is None:
            pe, self_mask = step_positions(past_keys, positions, dec.embed_positions.weight)
        else:  # slots: row b's token sits at positions[b]; no mask (the operator masks)
            assert positions is not None
            pe, self_mask = dec.embed_positions.weight[positions][:, None, :], None
            lengths = cache_lengths(positions)
        x = dec.embed_tokens(input_ids) * dec.embed_scale
        x = x + pe.to(x.dtype)
        cross_mask = (source_mask != 0)[:, None, None, :]
        presents: list[tuple[Tensor, Tensor]] = []
        cross_weights = memory_keys.new_zeros(0)
        for i, layer in enumerate(dec.layers):
            if self.qkv is None:
                k, v = _project_kv(layer.self_attn, x)
                k, v = torch.cat([past_keys[i], k], dim=2), torch.cat([past_values[i], v], dim=2)
                presents.append((k, v))
                attn, _ = _attend(layer.self_attn, x, k, v, self_mask)  # one query: no causal mask
            else:
                cache = (past_keys[i], past_values[i])
                heads, kv = slot_self_attention(x, self.qkv[i], cache, lengths, layer.self_attn.num_heads)
                presents.append(kv)
                attn = layer.self_attn.out_proj(heads)
            x = layer.self_attn_layer_norm(x + attn)
            memory = (memory_keys[i], memory_values[i], cross_mask)
            if sentence_rows is None or beam_index is None:
                cross, cross_weights = _attend(layer.encoder_attn, x, *memory)
            else:
                encoder_attn, fold = layer.encoder_attn, (sentence_rows, beam_index)
                q, shape = encoder_attn.q_proj(x), (encoder_attn.num_heads, encoder_attn.head_dim)
                heads, cross_weights = folded_cross_attention(q, memory, fold, shape, encoder_attn.scaling)
                cross = encoder_attn.out_proj(heads)
            x = _ffn(layer, layer.encoder_attn_layer_norm(x + cross))
        logits = self.model.lm_head(x[:, 0]).float() + self.bias
        return step_outputs(logits, presents, cross_weights)


# --- the reference: transformers' own forward and generate ---------------------------------------


class _HFDecoder:
    """MarianMTModel's cached forward behind the search's IncrementalDecoder protocol."""

    def __init__(self, model: Any, src: Tensor, pad_id: int, suppressed: Sequence[int]) -> None:
        self.model = model
        self.mask = (src != pad_id).long()
        with torch.no_grad():
            self.encoded = model.get_encoder()(input_ids=src, attention_mask=self.mask).last_hidden_state
        self.cache: Any = None
        self.suppressed = list(suppressed)

    @torch.no_grad()
    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        out = self.model(
            encoder_outputs=(self.encoded,),
            attention_mask=self.mask,
            decoder_input_ids=torch.from_numpy(last_tokens)[:, None],
            past_key_values=self.cache,
            use_cache=True,
            output_attentions=True,
        )
        self.cache = out.past_key_values
        logits = out.logits[:, -1].float()
        logits[:, self.suppressed] = -torch.inf  # NoBadWordsLogitsProcessor
        attn = out.cross_attentions[-1].float().mean(dim=1)[:, -1]
        return logits.log_softmax(-1).numpy(), attn.numpy()

    def reorder(self, rows: np.ndarray) -> None:
        idx = torch.from_numpy(rows)
        self.encoded, self.mask = self.encoded[idx], self.mask[idx]
        if self.cache is not None:
            self.cache.reorder_cache(idx)


class MarianReference:
    """What transformers computes: the cached forward's cross K/V and log-probs, and ``generate``."""

    def __init__(self, model: Any, pad_id: int, eos_id: int, suppressed: Sequence[int]) -> None:
        self.model, self.pad_id, self.eos_id, self.suppressed = model, pad_id, eos_id, list(suppressed)

    def decoder(self, src: Tensor) -> IncrementalDecoder:
        return _HFDecoder(self.model, src, self.pad_id, self.suppressed)

    def memory_kv(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """The cross-attention K/V transformers caches after a first decoder step."""
        dec = _HFDecoder(self.model, src, self.pad_id, self.suppressed)
        dec.step(np.full(src.shape[0], self.model.config.decoder_start_token_id, dtype=np.int64))
        layers = dec.cache.cross_attention_cache.layers
        return torch.stack([layer.keys for layer in layers]), torch.stack([layer.values for layer in layers])

    @torch.no_grad()
    def greedy(self, src_ids: Sequence[Sequence[int]], max_lens: Sequence[int]) -> list[list[int]]:
        """``generate(num_beams=1, do_sample=False)``, one call per length limit; forced </s> at
        the limit is switched off, since the project's search ends a too-long hypothesis
        unfinished instead."""
        out: list[list[int]] = [[] for _ in src_ids]
        for limit in sorted(set(max_lens)):
            rows = [i for i, n in enumerate(max_lens) if n == limit]
            width = max(len(src_ids[i]) for i in rows)
            src = torch.tensor([list(src_ids[i]) + [self.pad_id] * (width - len(src_ids[i])) for i in rows])
            generated = self.model.generate(
                input_ids=src,
                attention_mask=(src != self.pad_id).long(),
                num_beams=1,
                do_sample=False,
                max_length=limit + 1,
                forced_eos_token_id=None,
            )
            for i, row in zip(rows, generated[:, 1:].tolist(), strict=True):  # drop the start token
                out[i] = row[: row.index(self.eos_id)] if self.eos_id in row else row
        return out


# --- loading -------------------------------------------------------------------------------------


def _suppressed_ids(model: Any) -> list[int]:
    """Single-token ``bad_words_ids`` (Marian: [[pad]]) from the generation config or config."""
    bad = getattr(model.generation_config, "bad_words_ids", None) or getattr(
        model.config, "bad_words_ids", None
    )
    return sorted({ids[0] for ids in bad or [] if len(ids) == 1})


def _weight_files(directory: Path) -> tuple[Path, ...]:
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    if not files:
        raise MarianImportError(f"{directory}: no model weights (*.safetensors or pytorch_model*.bin)")
    return tuple(files)


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

    model: Any = MarianMTModel.from_pretrained(str(directory), attn_implementation="eager")
    model.eval()
    cfg = model.config
    pad_id, eos_id = int(cfg.pad_token_id), int(cfg.eos_token_id)
    start_id = int(cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else pad_id)
    unk_id = _unk_id(directory)
    tokenizer = marian_tokenizer(directory)
    suppressed = _suppressed_ids(model)
    name = name or directory.name
    src_langs, tgt_langs = _languages(directory, name)

    tokenizer_file = directory / "tokenizer.json"

    def build(dtype: torch.dtype, layout: DecoderLayout) -> tuple[nn.Module, nn.Module]:
        m: Any = MarianMTModel.from_pretrained(str(directory), attn_implementation="eager")
        m = m.eval().to(dtype)
        slots = layout == "per_layer_kv_slots"
        return MarianEncoderGraph(m, pad_id).eval(), MarianDecoderStepGraph(m, suppressed, slots).eval()

    return TranslationSource(
        kind="marian",
        name=name,
        path=directory,
        weight_files=_weight_files(directory),
        tokenizer=tokenizer,
        special=SpecialIds(pad=pad_id, bos=start_id, eos=eos_id, unk=unk_id),
        vocab_size=int(model.lm_head.out_features),
        n_layers=int(cfg.decoder_layers),
        n_heads=int(cfg.decoder_attention_heads),
        d_head=int(cfg.d_model // cfg.decoder_attention_heads),
        max_source_len=int(cfg.max_position_embeddings),
        max_target_len=int(cfg.max_position_embeddings),
        source_languages=src_langs,
        target_languages=tgt_langs,
        build_graphs=build,
        reference=MarianReference(model, pad_id, eos_id, suppressed),
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
