"""What the Hugging Face encoder-decoder sources (Marian, M2M-100/NLLB) share: their attention
written out for tracing, and the reference the verify stage checks our graphs against —
transformers' own cached forward and ``generate``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from torch import Tensor, nn

from export.sources import IncrementalDecoder
from export.sources.decoder_step import QKV, KeyValue
from service.engine.translation.sentence_search import EarlyStopping

# --- attention, as the eager path of transformers' BART-family attention --------------------------


def _split_heads(x: Tensor, attn: Any) -> Tensor:
    b, t, _ = x.shape
    return x.view(b, t, attn.num_heads, attn.head_dim).transpose(1, 2)  # (B, h, T, d)


def project_kv(attn: Any, x: Tensor) -> tuple[Tensor, Tensor]:
    return _split_heads(attn.k_proj(x), attn), _split_heads(attn.v_proj(x), attn)


def attend(attn: Any, x_q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scaling + mask) v, then out_proj; and the weights."""
    q = _split_heads(attn.q_proj(x_q), attn)
    scores = (q @ k.transpose(-2, -1)) * attn.scaling
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    heads = weights @ v  # (B, h, T_q, d)
    b, _, t, _ = heads.shape
    return attn.out_proj(heads.transpose(1, 2).reshape(b, t, -1)), weights


def cached_self_kv(attn: Any, x: Tensor, past: KeyValue) -> KeyValue:
    """A decoder step's self-attention keys/values: the cache one column longer."""
    k, v = project_kv(attn, x)
    return torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)


# --- the models of a directory ---------------------------------------------------------------------


def hf_model_type(path: Path) -> str | None:
    """``config.json``'s ``model_type`` of a Hugging Face model directory; None for anything else."""
    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return None
    model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    return str(model_type) if model_type is not None else None


def load_eager(model_class: Any, directory: Path, dtype: torch.dtype | None = None) -> Any:
    """``model_class`` from ``directory`` in eval mode, with the eager attention the graphs mirror."""
    model = model_class.from_pretrained(str(directory), attn_implementation="eager").eval()
    return model if dtype is None else model.to(dtype)


class Dimensions(TypedDict):
    """The sizes a ``TranslationSource`` states."""

    vocab_size: int
    n_layers: int
    n_heads: int
    d_head: int
    max_source_len: int
    max_target_len: int


def hf_dimensions(model: Any) -> Dimensions:
    """The ``TranslationSource`` sizes of a BART-family model (Marian, M2M-100)."""
    cfg = model.config
    return Dimensions(
        vocab_size=int(model.lm_head.out_features),
        n_layers=int(cfg.decoder_layers),
        n_heads=int(cfg.decoder_attention_heads),
        d_head=int(cfg.d_model // cfg.decoder_attention_heads),
        max_source_len=int(cfg.max_position_embeddings),
        max_target_len=int(cfg.max_position_embeddings),
    )


def decoder_layers(model: Any, slots: bool) -> tuple[list[Any], int, list[QKV] | None]:
    """A BART-family decoder's layers, heads, and (``slots``) their self-attention projections."""
    layers = list(model.model.decoder.layers)
    projections = [(a.q_proj, a.k_proj, a.v_proj) for a in (layer.self_attn for layer in layers)]
    return layers, int(layers[0].self_attn.num_heads), projections if slots else None


class EncoderGraph(nn.Module):
    """The encoder graph's module over a BART-family model: input_ids → the decoder layers'
    cross-attention K/V (``forward`` per architecture)."""

    model: Any  # the ...ForConditionalGeneration model (registered as a submodule)

    def __init__(self, model: Any, pad_id: int) -> None:
        super().__init__()
        self.model = model
        self.pad_id = pad_id


def weight_files(directory: Path, error: type[Exception]) -> tuple[Path, ...]:
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    if not files:
        raise error(f"{directory}: no model weights (*.safetensors or pytorch_model*.bin)")
    return tuple(files)


def generation_early_stopping(model: Any) -> EarlyStopping:
    """When transformers' ``generate`` stops the model's beam search by default: its generation
    config's ``early_stopping`` (generation_config.json, or config.json's for older
    directories), False where it names none, as ``generate`` takes it."""
    value = model.generation_config.early_stopping
    if value is None:
        return False
    if value not in (True, False, "never"):
        raise ValueError(f'early_stopping must be true, false or "never", not {value!r}')
    return bool(value) if isinstance(value, bool) else "never"


# --- the reference --------------------------------------------------------------------------------


class HFCachedDecoder:
    """A transformers encoder-decoder's cached forward behind the search's IncrementalDecoder
    protocol; ``suppressed`` tokens are never chosen (NoBadWordsLogitsProcessor)."""

    def __init__(self, model: Any, src: Tensor, pad_id: int, suppressed: Sequence[int] = ()) -> None:
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
            cache=self.cache,
            use_cache=True,
            output_attentions=True,
        )
        self.cache = out.past_key_values
        logits = out.logits[:, -1].float()
        if self.suppressed:
            logits[:, self.suppressed] = -torch.inf
        attn = out.cross_attentions[-1].float().mean(dim=1)[:, -1]
        return logits.log_softmax(-1).numpy(), attn.numpy()

    def reorder(self, rows: np.ndarray) -> None:
        idx = torch.from_numpy(rows)
        self.encoded, self.mask = self.encoded[idx], self.mask[idx]
        if self.cache is not None:
            self.cache.reorder_cache(idx)


class Seq2SeqReference:
    """What transformers computes: the cached forward's cross K/V and log-probs, and greedy
    ``generate``. ``forced_first`` is a token forced right after the decoder start (M2M-100's
    target language), counted in the length limit as in the engine and left out of the ids."""

    def __init__(
        self,
        model: Any,
        pad_id: int,
        eos_id: int,
        suppressed: Sequence[int] = (),
        forced_first: int | None = None,
    ) -> None:
        self.model, self.pad_id, self.eos_id = model, pad_id, eos_id
        self.suppressed, self.forced_first = list(suppressed), forced_first

    def decoder(self, src: Tensor) -> IncrementalDecoder:
        return HFCachedDecoder(self.model, src, self.pad_id, self.suppressed)

    def memory_kv(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """The cross-attention K/V transformers caches after a first decoder step."""
        dec = HFCachedDecoder(self.model, src, self.pad_id, self.suppressed)
        dec.step(np.full(src.shape[0], self.model.config.decoder_start_token_id, dtype=np.int64))
        layers = dec.cache.cross_attention_cache.layers
        return torch.stack([layer.keys for layer in layers]), torch.stack([layer.values for layer in layers])

    def greedy(self, src_ids: Sequence[Sequence[int]], max_lens: Sequence[int]) -> list[list[int]]:
        """``generate(num_beams=1, do_sample=False)``."""
        return [best for (best,) in self.generate(src_ids, max_lens, num_beams=1)]

    @torch.no_grad()
    def generate(
        self, src_ids: Sequence[Sequence[int]], max_lens: Sequence[int], **options: Any
    ) -> list[list[list[int]]]:
        """``generate(do_sample=False, **options)``'s sequences per source (``num_return_sequences``
        of them, best first), one call per length limit; forced </s> at the limit is switched
        off, since the project's search ends a too-long hypothesis unfinished instead."""
        forced = {} if self.forced_first is None else {"forced_bos_token_id": self.forced_first}
        dropped = 1 if self.forced_first is None else 2  # the start token, the forced one
        n = int(options.get("num_return_sequences", 1))
        out: list[list[list[int]]] = [[] for _ in src_ids]
        for limit in sorted(set(max_lens)):
            rows = [i for i, length in enumerate(max_lens) if length == limit]
            width = max(len(src_ids[i]) for i in rows)
            src = torch.tensor([list(src_ids[i]) + [self.pad_id] * (width - len(src_ids[i])) for i in rows])
            generated = self.model.generate(
                input_ids=src,
                attention_mask=(src != self.pad_id).long(),
                do_sample=False,
                max_length=limit + 1,
                forced_eos_token_id=None,
                **forced,
                **options,
            )
            sequences = generated[:, dropped:].tolist()
            for j, i in enumerate(rows):
                out[i] = [self._cut(row) for row in sequences[j * n : (j + 1) * n]]
        return out

    def _cut(self, row: list[int]) -> list[int]:
        """A generated row without its </s> and the padding after it."""
        return row[: row.index(self.eos_id)] if self.eos_id in row else row
