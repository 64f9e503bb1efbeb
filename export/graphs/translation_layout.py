"""The translation ONNX layout: the graphs' input and output names, shapes and dynamic axes.

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
  tensor and stacks nothing (docs/decisions.md, "The decoder hands the search its candidates, not
  the vocabulary"). Both are built
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
``present_values_i`` (export/sources/cached_attention.py: onnxruntime's GroupQueryAttention, with the
Q/K/V projections fused). Bound to the same memory as the input, the output is written in place:
no step concatenates or copies a cache, and rows join, leave or follow a beam by writing only
their own slot (service/engine/slots.py). fp16 (the GPU variant) keeps ``per_layer_kv_positions``,
whose cache the device backend holds on the GPU. The slot layout holds the cross-attention
memory once per sentence, not per row: ``memory_*_i`` (sentences, n_heads, src_len, d_head) and
``source_mask`` (sentences, src_len), with ``sentence_rows`` int64 (sentences, width), each
sentence's rows (padded by repeating one), and ``beam_index`` int64 (batch,), each row's place
among the sentences × width folded queries (export/sources/cached_attention.py:
``folded_cross_attention``).
"""

from __future__ import annotations

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
    per_layer,
)

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
