"""The translation ONNX layout, our Transformer wrapped into it, and the torch → ONNX export.

The service engine is written against exactly these names and shapes:

* ``encoder.onnx``: ``input_ids`` int64 (batch, src_len) → ``memory_keys``, ``memory_values``
  (n_layers, batch, n_heads, src_len, d_head): every decoder layer's cross-attention K/V, computed
  once per batch.
* ``decoder.onnx``, one step: ``input_ids`` int64 (batch, 1), ``source_mask`` int64 (batch, src_len)
  (1 = real token), ``memory_keys``/``memory_values``, ``past_keys``/``past_values``
  (n_layers, batch, n_heads, past_len, d_head; past_len may be 0) → ``log_probs`` float32
  (batch, vocab), ``present_keys``/``present_values`` (…, past_len + 1, d_head) and
  ``cross_attention`` float32 (batch, src_len): the last layer's weights, mean over heads.
* The manifest's ``translation.decoder_layout`` says which decoder I/O an artefact has
  (``decoder_io`` lists the names): ``stacked_kv`` is the graph above; ``stacked_kv_top_k`` adds
  an int64 input ``top_k`` of shape [1] and outputs ``top_log_probs`` float32 / ``top_tokens``
  int64 (batch, top_k), each row's best tokens from an in-graph ``TopK``, so the search reads
  (rows, 2·beam) candidates instead of (rows, vocab) (``top_k`` 0: none, for step-by-step
  comparisons on ``log_probs``); ``per_layer_kv_top_k`` also replaces every
  stacked K/V input and output by one per layer (``memory_keys_0`` … ``past_values_{n-1}``,
  (batch, n_heads, len, d_head); ``present_keys_0`` …), so a step copies no layer out of a stacked
  tensor and stacks nothing (measured 1.11–1.13× tok/s, benchmarks/README.md). Both are built
  from the traced stacked graph by ``onnx_tools.append_top_k`` and ``onnx_tools.unstack_layers``,
  for our checkpoints and Marian imports alike.

``per_layer_kv_positions`` (the fp16 export) adds an int64 input ``positions`` (batch,): the
number of tokens each row has already decoded. A row's cached keys are the *last* ``positions``
columns of its past (earlier columns are padding, masked out of self-attention), and the new
token takes position ``positions`` in the sinusoidal encoding. Rows that started decoding at
different steps can so share one step: the decode scheduler admits new sentences into a running
batch (left-padded with empty columns) and retires finished ones (service/scheduling.py). In the
older layouts the new token's position is past_len, read from ``past_keys``' shape, and every row
of a batch must have started together.

``per_layer_kv_slots``, the default export for the CPU variants (fp32, int8), keeps ``positions``
but replaces the growing past by preallocated cache buffers ``cache_keys_i``/``cache_values_i``
(batch, n_heads, cache_len, d_head): row b's history is its *first* ``positions[b]`` columns, the
step writes the new column there and outputs the whole buffer as ``present_keys_i`` /
``present_values_i`` (export/cached_attention.py: onnxruntime's GroupQueryAttention, with the
Q/K/V projections fused). Bound to the same memory as the input, the output is written in place:
no step concatenates or copies a cache, and rows join, leave or follow a beam by writing only
their own slot (service/engine/slots.py). fp16 (the GPU variant) keeps ``per_layer_kv_positions``,
whose cache the device backend holds on the GPU. The slot layout holds the cross-attention
memory once per sentence, not per row: ``memory_*_i`` (sentences, n_heads, src_len, d_head) and
``source_mask`` (sentences, src_len), with ``sentence_rows`` int64 (sentences, width), each
sentence's rows (padded by repeating one), and ``beam_index`` int64 (batch,), each row's place
among the sentences × width folded queries (export/cached_attention.py:
``folded_cross_attention``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from export.cached_attention import cache_lengths, folded_cross_attention, fused_qkv, slot_self_attention
from export.checkpoint import load_checkpoint, read_config
from export.data import pad
from export.model import DecoderLayer, Transformer
from export.onnx_tools import append_top_k, export_onnx, unstack_layers
from export.sources import (
    IncrementalDecoder,
    TranslationSource,
    generation_length_penalty,
    languages_from_name,
)
from export.translate import TorchDecoder
from service.artefacts import (
    BEAM_INDEX,
    CACHE_KEYS,
    CACHE_VALUES,
    CROSS_ATTENTION,
    INPUT_IDS,
    LOG_PROBS,
    MEMORY_KEYS,
    MEMORY_VALUES,
    PAST_KEYS,
    PAST_VALUES,
    POSITIONS,
    PRESENT_KEYS,
    PRESENT_VALUES,
    SENTENCE_ROWS,
    SOURCE_MASK,
    TOP_K,
    TOP_LOG_PROBS,
    TOP_TOKENS,
    DecoderLayout,
    SpecialIds,
    per_layer,
)
from service.engine.search import beam_search

ENCODER_INPUTS = [INPUT_IDS]
ENCODER_OUTPUTS = [MEMORY_KEYS, MEMORY_VALUES]
DECODER_INPUTS = [INPUT_IDS, SOURCE_MASK, MEMORY_KEYS, MEMORY_VALUES, PAST_KEYS, PAST_VALUES]
DECODER_OUTPUTS = [LOG_PROBS, PRESENT_KEYS, PRESENT_VALUES, CROSS_ATTENTION]
TOP_K_OUTPUTS = [TOP_LOG_PROBS, TOP_TOKENS]
CACHE_INPUTS = [CACHE_KEYS, CACHE_VALUES]  # layout per_layer_kv_slots, in place of past_*
FOLD_INPUTS = [SENTENCE_ROWS, BEAM_INDEX]  # layout per_layer_kv_slots: memory per sentence
DEFAULT_DECODER_LAYOUT: DecoderLayout = "per_layer_kv_slots"
DEVICE_DECODER_LAYOUT: DecoderLayout = "per_layer_kv_positions"  # fp16: the GPU variant


def decoder_io(layout: DecoderLayout, n_layers: int) -> tuple[list[str], list[str]]:
    """The decoder graph's input and output names, in order, for ``layout``."""
    if layout == "stacked_kv":
        return DECODER_INPUTS, DECODER_OUTPUTS
    traced = traced_decoder_inputs(layout)
    inputs, outputs = [*traced, TOP_K], [*DECODER_OUTPUTS, *TOP_K_OUTPUTS]
    if layout == "stacked_kv_top_k":
        return inputs, outputs
    stacked_in, stacked_out = traced[2:6], DECODER_OUTPUTS[1:3]
    layered_in = [per_layer(name, i) for name in stacked_in for i in range(n_layers)]
    layered_out = [per_layer(name, i) for name in stacked_out for i in range(n_layers)]
    return [x for x in inputs if x not in stacked_in] + layered_in, [
        x for x in outputs if x not in stacked_out
    ] + layered_out


def traced_decoder_inputs(layout: DecoderLayout) -> list[str]:
    """The decoder wrapper's inputs, in order, as traced (before top-k and per-layer inputs)."""
    if layout == "per_layer_kv_slots":
        return [*DECODER_INPUTS[:4], *CACHE_INPUTS, POSITIONS, *FOLD_INPUTS]
    return [*DECODER_INPUTS, POSITIONS] if layout == "per_layer_kv_positions" else DECODER_INPUTS


_KV_SRC = {1: "batch", 3: "src_len"}
ENCODER_AXES: dict[str, dict[int, str]] = {
    INPUT_IDS: {0: "batch", 1: "src_len"},
    MEMORY_KEYS: _KV_SRC,
    MEMORY_VALUES: _KV_SRC,
}
DECODER_AXES: dict[str, dict[int, str]] = {
    INPUT_IDS: {0: "batch"},
    SOURCE_MASK: {0: "batch", 1: "src_len"},
    MEMORY_KEYS: _KV_SRC,
    MEMORY_VALUES: _KV_SRC,
    PAST_KEYS: {1: "batch", 3: "past_len"},
    PAST_VALUES: {1: "batch", 3: "past_len"},
    LOG_PROBS: {0: "batch"},
    PRESENT_KEYS: {1: "batch", 3: "past_len_plus_1"},
    PRESENT_VALUES: {1: "batch", 3: "past_len_plus_1"},
    CROSS_ATTENTION: {0: "batch", 1: "src_len"},
    POSITIONS: {0: "batch"},
    CACHE_KEYS: {1: "batch", 3: "cache_len"},
    CACHE_VALUES: {1: "batch", 3: "cache_len"},
}
_KV_SENTENCES = {1: "sentences", 3: "src_len"}
SLOT_AXES = {  # what layout per_layer_kv_slots changes: memory per sentence, the cache written in place
    SOURCE_MASK: {0: "sentences", 1: "src_len"},
    MEMORY_KEYS: _KV_SENTENCES,
    MEMORY_VALUES: _KV_SENTENCES,
    SENTENCE_ROWS: {0: "sentences", 1: "width"},
    BEAM_INDEX: {0: "batch"},
    PRESENT_KEYS: {1: "batch", 3: "cache_len"},
    PRESENT_VALUES: {1: "batch", 3: "cache_len"},
}


def stack_kv(kv: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Per-layer (k, v) pairs of (B, h, T, d) → keys, values (n_layers, B, h, T, d)."""
    return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])


def step_outputs(
    logits: Tensor, presents: Sequence[tuple[Tensor, Tensor]], cross_weights: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The decoder graph's outputs from one step's (B, V) logits, per-layer caches and (B, h, 1, S)
    last-layer cross-attention; log-softmax and alignments in float32 whatever the model dtype,
    so an fp16 graph keeps full-precision scores."""
    present_keys, present_values = stack_kv(presents)
    log_probs = logits.float().log_softmax(dim=-1)
    return log_probs, present_keys, present_values, cross_weights.float().mean(dim=1)[:, 0]


class EncoderGraph(nn.Module):
    """Our model's encoder plus every decoder layer's cross-attention K/V projection."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        return stack_kv(self.model.memory_kv(self.model.encode(input_ids)))


def step_positions(
    past_keys: Tensor, positions: Tensor | None, table: Tensor
) -> tuple[Tensor, Tensor | None]:
    """One decoder step's positional encodings (rows of ``table``) and self-attention mask.

    Without ``positions`` every row has decoded past_len tokens: one position for all (1, d),
    no mask (the single new query may see every cached key). With ``positions`` (B,), row b's
    cached keys are the last ``positions[b]`` of the past_len columns, so of the past_len + 1
    keys (past and the new one) it sees columns ≥ past_len − positions[b]: encodings (B, 1, d),
    mask (B, 1, 1, past_len + 1).
    """
    past_len = past_keys.shape[3]
    if positions is None:
        return table[past_len], None
    columns = torch.arange(past_len + 1, device=positions.device)
    return table[positions][:, None, :], (columns[None, :] >= (past_len - positions)[:, None])[
        :, None, None, :
    ]


class DecoderStepGraph(nn.Module):
    """One cached decoder step of our model, with positions and masks from ``step_positions``.

    It calls the model's own layers, so numerics equal ``Transformer.decode`` with ``past``; only
    the glue differs: the single new query needs no causal mask, only the padding mask of rows
    that joined a running batch later (layout per_layer_kv_positions). With ``slots`` (layout
    per_layer_kv_slots) the past is a slot cache written in place (export/cached_attention.py),
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


def example_inputs(
    n_layers: int, n_heads: int, d_head: int, vocab_size: int, dtype: torch.dtype, pad_id: int
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Tracing inputs whose dynamic sizes (batch 5, src_len 11, past_len 7) differ from each other
    and from usual layer/head counts, so no exporter can mistake one axis for another; the last
    row is padded."""
    batch, src_len, past_len = 5, 11, 7
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab_size, (batch, src_len), generator=g)
    src[-1, src_len - 3 :] = pad_id
    kv_src = (n_layers, batch, n_heads, src_len, d_head)
    kv_past = (n_layers, batch, n_heads, past_len, d_head)
    step = (
        torch.randint(4, vocab_size, (batch, 1), generator=g),
        (src != pad_id).long(),
        torch.randn(kv_src, generator=g).to(dtype),
        torch.randn(kv_src, generator=g).to(dtype),
        torch.randn(kv_past, generator=g).to(dtype),
        torch.randn(kv_past, generator=g).to(dtype),
    )
    return src, step


def slot_step(step: tuple[Tensor, ...], last: int) -> tuple[Tensor, ...]:
    """The tracing step of layout per_layer_kv_slots from ``example_inputs``' (5 rows): rows at
    cache columns last, 3, 0, 5, 2 and the memory of 2 sentences, of 3 and 2 rows (the second
    padded to the width 3)."""
    input_ids, source_mask, memory_keys, memory_values, cache_keys, cache_values = step
    positions = torch.tensor([last, 3, 0, 5, 2])
    sentence_rows, beam_index = torch.tensor([[0, 1, 2], [3, 4, 4]]), torch.arange(5)
    memory = (source_mask[:2], memory_keys[:, :2], memory_values[:, :2])
    return (input_ids, *memory, cache_keys, cache_values, positions, sentence_rows, beam_index)


def export_graphs(
    encoder: nn.Module,
    decoder: nn.Module,
    src: Tensor,
    step: tuple[Tensor, ...],
    out_dir: Path,
    layout: DecoderLayout = DEFAULT_DECODER_LAYOUT,
) -> tuple[Path, Path]:
    """Trace both wrappers to ``encoder.onnx`` and ``decoder.onnx`` with the layout's names and
    dynamic axes (``onnx_tools.export_onnx``: the TorchScript exporter at opset 17, which keeps
    the shape arithmetic, positions from ``past_keys``, dynamic); ``stacked_kv_top_k`` then
    appends the candidates' ``TopK`` to the decoder."""
    encoder.eval(), decoder.eval()  # the exporter restores the wrapper's mode, recursively, afterwards
    names = traced_decoder_inputs(layout)
    past_len, rows = step[4].shape[3], step[0].shape[0]
    axes = DECODER_AXES
    if layout == "per_layer_kv_positions":  # rows of the tracing batch decoded 7, 3, 0, 5, … tokens
        step = (*step, torch.tensor([past_len, 3, 0, 5, past_len][:rows] + [past_len] * (rows - 5)))
    elif layout == "per_layer_kv_slots":  # slots of 7 columns, rows at columns 6, 3, 0, 5, …
        step = slot_step(step, past_len - 1)
        axes = {**DECODER_AXES, **SLOT_AXES}
    enc_path = export_onnx(
        encoder,
        (src,),
        out_dir / "encoder.onnx",
        input_names=ENCODER_INPUTS,
        output_names=ENCODER_OUTPUTS,
        dynamic_axes=ENCODER_AXES,
    )
    dec_path = export_onnx(
        decoder,
        step,
        out_dir / "decoder.onnx",
        input_names=names,
        output_names=DECODER_OUTPUTS,
        dynamic_axes={k: v for k, v in axes.items() if k in (*names, *DECODER_OUTPUTS)},
    )
    if layout != "stacked_kv":
        append_top_k(dec_path, LOG_PROBS, TOP_K, *TOP_K_OUTPUTS)
    if layout not in ("stacked_kv", "stacked_kv_top_k"):
        unstack_layers(dec_path, names[2:6], DECODER_OUTPUTS[1:3])
    return enc_path, dec_path
