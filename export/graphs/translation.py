"""The translation graphs of each variant: traced from a source's wrappers with the names and axes
of export/graphs/translation_layout.py, then optimised, quantised or converted.

fp32 is the plain traced graphs (onnxruntime's CPU ``SkipLayerNormalization``, the one fusion
the optimiser made in them, ran slower than the Add + LayerNormalization it replaces: see
``build_fp32``); int8 the fp32 graphs' per-row rewrite (export/graphs/int8_rowwise.py); fp16
traced in float16 and optimised with onnxruntime's encoder-decoder fusions. Each builder returns
the fusion counts the manifest records.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
import onnxruntime as ort
import torch
from torch import Tensor, nn

from export.graphs.int8_rowwise import quantize_int8
from export.graphs.onnx_tools import append_top_k, export_onnx, graph_spec, optimize, unstack_layers
from export.graphs.translation_layout import (
    DECODER_AXES,
    DECODER_OUTPUTS,
    DEFAULT_DECODER_LAYOUT,
    DEVICE_DECODER_LAYOUT,
    ENCODER_AXES,
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
    SLOT_AXES,
    TOP_K_OUTPUTS,
    traced_decoder_inputs,
)
from export.progress import progress
from export.sources import TranslationSource
from service.artefacts import LOG_PROBS, TOP_K, DecoderLayout, Variant, decoder_layout_of

TRANSLATION_GRAPHS = ("encoder.onnx", "decoder.onnx")
# the slot layout's, with a shortlist and blocked candidates (fp16 keeps the GPU's layout)
SLOT_VARIANTS = ("fp32", "int8")


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


def optimize_graph(path: Path, source: TranslationSource) -> dict[str, int]:
    """onnxruntime's transformer optimiser with the encoder-decoder ("bart") fusions, in place and
    portable (opt_level 0). Returns what fused; {} when it does not apply (best effort: an unfused
    graph is still correct, and verification runs on whatever is written)."""
    try:
        return optimize(path, path, "bart", source.n_heads, source.n_heads * source.d_head, opt_level=0)
    except Exception as e:
        progress(f"  optimiser skipped for {path.name}: {e}")
        return {}


def merge_fusions(*counts: dict[str, int]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            merged[k] = merged.get(k, 0) + v
    return merged


def export_raw(
    source: TranslationSource,
    encoder: torch.nn.Module,
    decoder: torch.nn.Module,
    dtype: torch.dtype,
    out_dir: Path,
    layout: DecoderLayout = DEFAULT_DECODER_LAYOUT,
) -> None:
    """The traced, unoptimised encoder and decoder-step graphs in ``out_dir``."""
    src, step = example_inputs(
        source.n_layers, source.n_heads, source.d_head, source.vocab_size, dtype, source.special.pad
    )
    export_graphs(encoder, decoder, src, step, out_dir, layout)


def _traced(source: TranslationSource, dtype: torch.dtype, out_dir: Path, layout: DecoderLayout) -> None:
    encoder, decoder = source.build_graphs(dtype, layout)
    export_raw(source, encoder, decoder, dtype, out_dir, layout)


def build_fp32(
    source: TranslationSource, out_dir: Path, layout: DecoderLayout = DEFAULT_DECODER_LAYOUT
) -> None:
    """The traced fp32 graphs in ``out_dir``, unfused (their manifest lists no fusions).

    They are the CPU variants' (fp32, and int8 made from them). Fused, the residual Add and
    LayerNormalization become onnxruntime's ``SkipLayerNormalization``, whose CPU kernel runs
    slower than the two nodes, as in the MiniLM encoder (docs/decisions.md, "The CPU graphs keep
    the plain Add + LayerNormalization and Gelu")."""
    _traced(source, torch.float32, out_dir, layout)


def build_int8(fp32_dir: Path, out_dir: Path) -> dict[str, int]:
    """Per-row int8 graphs (export/graphs/int8_rowwise.py); returns the count of quantised MatMuls."""
    for name in TRANSLATION_GRAPHS:
        quantize_int8(fp32_dir / name, out_dir / name)
    return count_ops(out_dir, ("MatMulIntegerToFloat",))


def build_fp16(source: TranslationSource, out_dir: Path) -> dict[str, int]:
    """The model traced in float16: K/V and hidden states in float16; log_probs and alignments stay
    float32 (the wrappers cast before log-softmax), so scores keep full precision."""
    layout = variant_layout("fp16")
    _traced(source, torch.float16, out_dir, layout)
    return merge_fusions(*(optimize_graph(out_dir / f, source) for f in TRANSLATION_GRAPHS))


def variant_layout(variant: Variant) -> DecoderLayout:
    """The decoder layout a variant is exported with: the in-place slot cache for the CPU variants
    (fp32, int8), the positions layout whose cache the device backend keeps on the GPU for fp16."""
    return DEVICE_DECODER_LAYOUT if variant == "fp16" else DEFAULT_DECODER_LAYOUT


def count_ops(
    directory: Path, ops: Sequence[str], files: Sequence[str] = TRANSLATION_GRAPHS
) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in files:
        for node in onnx.load(str(directory / name), load_external_data=False).graph.node:
            if node.op_type in ops:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def cpu_fp16_casts(directory: Path, work: Path) -> float:
    """How many Cast nodes the CPU provider inserts into the fp16 graphs: around each op it has no
    float16 kernel for, which then runs in float32. CPU figures of an fp16 variant are therefore
    closer to fp32 than what a GPU computes; its BLEU and parity are verified only as far as that."""
    inserted = 0
    for name in TRANSLATION_GRAPHS:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(work / f"cpu-{name}")
        ort.InferenceSession(str(directory / name), options, providers=["CPUExecutionProvider"])
        before = count_ops(directory, ("Cast",), [name]).get("Cast", 0)
        inserted += count_ops(work, ("Cast",), [f"cpu-{name}"]).get("Cast", 0) - before
    return float(inserted)


def decoder_layout(path: Path) -> DecoderLayout:
    """The layout the decoder graph at ``path`` has, read from its inputs."""
    return decoder_layout_of(t.name for t in graph_spec(path).inputs)
