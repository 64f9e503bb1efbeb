"""The translation ONNX layout: the graphs' input and output names, shapes and dynamic axes.

The service engine is written against exactly these names and shapes:

* ``encoder.onnx``: ``input_ids`` int64 (batch, src_len) → ``memory_keys``, ``memory_values``
  (n_layers, batch, n_heads, src_len, d_head): every decoder layer's cross-attention K/V, computed
  once per batch.
* ``decoder.onnx``, one step, in one of two layouts (``DecoderIO``; the manifest's
  ``translation.decoder_layout`` names it). Both are traced from a decoder step whose K/V inputs
  and outputs are stacked over the layers; ``onnx_tools.append_top_k`` then adds an int64 input
  ``top_k`` of shape [1] and outputs ``top_log_probs`` float32 / ``top_tokens`` int64
  (batch, top_k), each row's best tokens from an in-graph ``TopK``, so the search reads
  (rows, 2·beam) candidates instead of (rows, vocab) (``top_k`` 0: none, for step-by-step
  comparisons on ``log_probs`` float32 (batch, vocab)), and ``onnx_tools.unstack_layers``
  replaces every stacked K/V input and output by one per layer (``memory_keys_0`` …, (batch,
  n_heads, len, d_head)), so a step copies no layer out of a stacked tensor and stacks nothing
  (docs/decisions.md, "The decoder hands the search its candidates, not the vocabulary"). Both
  output ``cross_attention`` float32 (batch, src_len): the last layer's weights, mean over heads.

``per_layer_kv_positions`` (the fp16 export, whose cache the device backend keeps on the GPU)
takes one onnxruntime run a step, the beam's reorder included. It feeds the memory once per
sentence, ``memory_*_i`` (sentences, n_heads, src_len, d_head) and ``source_mask`` int64
(sentences, src_len) (1 = real token), with ``memory_rows`` int64 (batch,), each row's sentence;
the growing cache of the last step ``past_keys_i``/``past_values_i`` (past_rows, n_heads,
past_len, d_head; past_len may be 0) with ``beam_rows`` int64 (batch,), the past row each row
continues: the graph gathers each layer's past by ``beam_rows`` (and memory and mask by
``memory_rows``) before the step, so the output ``present_*_i`` (batch, …, past_len + 1, d_head)
is already in the rows' order and the service never moves a cache between steps; and
``positions`` int64 (batch,): the number of tokens each row has already decoded. A row's cached
keys are the *last* ``positions`` columns of its past (earlier columns are padding, masked out of
self-attention), and the new token takes position ``positions`` in the sinusoidal encoding, so
rows that started decoding at different steps share one step.

``per_layer_kv_slots``, the default export for the CPU variants (fp32, int8), keeps ``positions``
but replaces the growing past by preallocated cache buffers ``cache_keys_i``/``cache_values_i``
(batch, n_heads, cache_len, d_head): row b's history is its *first* ``positions[b]`` columns, the
step writes the new column there and outputs the whole buffer as ``present_keys_i`` /
``present_values_i`` (export/sources/cached_attention.py: onnxruntime's GroupQueryAttention, with the
Q/K/V projections fused). Bound to the same memory as the input, the output is written in place:
no step concatenates or copies a cache, and rows join, leave or follow a beam by writing only
their own slot (service/engine/translation/slots.py). It holds the cross-attention memory once per sentence,
not per row: ``memory_*_i`` (sentences, n_heads, src_len, d_head) and ``source_mask``
(sentences, src_len), with ``sentence_rows`` int64 (sentences, width), each sentence's rows
(padded by repeating one), and ``beam_index`` int64 (batch,), each row's place among the
sentences × width folded queries (export/sources/cached_attention.py: ``folded_cross_attention``).

This module is the one place that tells the two layouts apart; the rest of the export asks a
``DecoderIO`` for its names, axes and ``slots``.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.artefacts import (
    BEAM_INDEX,
    BEAM_ROWS,
    CACHE_KEYS,
    CACHE_VALUES,
    CROSS_ATTENTION,
    INPUT_IDS,
    LOG_PROBS,
    MEMORY_KEYS,
    MEMORY_ROWS,
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
    per_layer,
)

ENCODER_INPUTS = [INPUT_IDS]
ENCODER_OUTPUTS = [MEMORY_KEYS, MEMORY_VALUES]
DECODER_INPUTS = [INPUT_IDS, SOURCE_MASK, MEMORY_KEYS, MEMORY_VALUES, PAST_KEYS, PAST_VALUES]
DECODER_OUTPUTS = [LOG_PROBS, PRESENT_KEYS, PRESENT_VALUES, CROSS_ATTENTION]
TOP_K_OUTPUTS = [TOP_LOG_PROBS, TOP_TOKENS]
CACHE_INPUTS = [CACHE_KEYS, CACHE_VALUES]  # slots, in place of past_*
FOLD_INPUTS = [SENTENCE_ROWS, BEAM_INDEX]  # slots: memory per sentence
ROW_INPUTS = [BEAM_ROWS, MEMORY_ROWS]  # positions: the cache and the memory gathered in the graph


@dataclass(frozen=True)
class DecoderIO:
    """One decoder layout's I/O, from its tracing to the names the service feeds."""

    layout: DecoderLayout

    @property
    def slots(self) -> bool:
        """The cache written in place in row slots, the memory held once per sentence."""
        return self.layout == "per_layer_kv_slots"

    def traced_inputs(self) -> list[str]:
        """The decoder wrapper's inputs, in order, as traced (before top-k and per-layer inputs)."""
        if self.slots:
            return [*DECODER_INPUTS[:4], *CACHE_INPUTS, POSITIONS, *FOLD_INPUTS]
        return [*DECODER_INPUTS, POSITIONS, *ROW_INPUTS]

    def axes(self) -> dict[str, dict[int, str]]:
        """The dynamic axes of the traced graph's inputs and outputs."""
        axes = {**DECODER_AXES, **(SLOT_AXES if self.slots else POSITIONS_AXES)}
        return {k: v for k, v in axes.items() if k in (*self.traced_inputs(), *DECODER_OUTPUTS)}

    def names(self, n_layers: int) -> tuple[list[str], list[str]]:
        """The decoder graph's input and output names, in order: the traced ones with ``top_k``
        and its outputs, every stacked K/V replaced by one per layer."""
        traced = self.traced_inputs()
        stacked_in, stacked_out = self.stacked_inputs(), DECODER_OUTPUTS[1:3]
        layered_in = [per_layer(name, i) for name in stacked_in for i in range(n_layers)]
        layered_out = [per_layer(name, i) for name in stacked_out for i in range(n_layers)]
        inputs = [x for x in [*traced, TOP_K] if x not in stacked_in] + layered_in
        outputs = [x for x in [*DECODER_OUTPUTS, *TOP_K_OUTPUTS] if x not in stacked_out] + layered_out
        return inputs, outputs

    def stacked_inputs(self) -> list[str]:
        """The traced inputs stacked over the layers: memory K/V, then the cache's."""
        return self.traced_inputs()[2:6]


SLOT_DECODER = DecoderIO("per_layer_kv_slots")  # the CPU variants' (fp32, int8)
POSITIONS_DECODER = DecoderIO("per_layer_kv_positions")  # fp16: the GPU variant's


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
POSITIONS_AXES = {  # what layout per_layer_kv_positions changes: memory per sentence, the past per row
    SOURCE_MASK: {0: "sentences", 1: "src_len"},
    MEMORY_KEYS: _KV_SENTENCES,
    MEMORY_VALUES: _KV_SENTENCES,
    PAST_KEYS: {1: "past_rows", 3: "past_len"},
    PAST_VALUES: {1: "past_rows", 3: "past_len"},
    BEAM_ROWS: {0: "batch"},
    MEMORY_ROWS: {0: "batch"},
}
SLOT_AXES = {  # what layout per_layer_kv_slots changes: memory per sentence, the cache written in place
    SOURCE_MASK: {0: "sentences", 1: "src_len"},
    MEMORY_KEYS: _KV_SENTENCES,
    MEMORY_VALUES: _KV_SENTENCES,
    SENTENCE_ROWS: {0: "sentences", 1: "width"},
    BEAM_INDEX: {0: "batch"},
    PRESENT_KEYS: {1: "batch", 3: "cache_len"},
    PRESENT_VALUES: {1: "batch", 3: "cache_len"},
}
