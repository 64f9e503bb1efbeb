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
from export.graphs.onnx_tools import append_top_k, export_onnx, graph_spec, optimize
from export.graphs.translation_layout import (
    DECODER_OUTPUTS,
    ENCODER_AXES,
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
    POSITIONS_DECODER,
    SLOT_DECODER,
    TOP_K_OUTPUTS,
    DecoderIO,
)
from export.graphs.unstack import unstack_layers
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


def tracing_step(step: tuple[Tensor, ...], decoder: DecoderIO) -> tuple[Tensor, ...]:
    """The decoder's tracing inputs from ``example_inputs``' step (5 rows, 7 columns of past), the
    memory of 2 sentences, of 3 and 2 rows. Positions: the rows continue past rows 2, 0, 1, 1, 2
    of 3 and have decoded 7, 3, 0, 5, 7 tokens. Slots: rows at cache columns 6, 3, 0, 5, 2, the
    second sentence padded to the width 3."""
    input_ids, source_mask, memory_keys, memory_values, cache_keys, cache_values = step
    past_len = cache_keys.shape[3]
    memory = (source_mask[:2], memory_keys[:, :2], memory_values[:, :2])
    if not decoder.slots:
        positions = torch.tensor([past_len, 3, 0, 5, past_len])
        beam_rows, memory_rows = torch.tensor([2, 0, 1, 1, 2]), torch.tensor([0, 0, 0, 1, 1])
        past = cache_keys[:, :3], cache_values[:, :3]
        return (input_ids, *memory, *past, positions, beam_rows, memory_rows)
    positions = torch.tensor([past_len - 1, 3, 0, 5, 2])
    sentence_rows, beam_index = torch.tensor([[0, 1, 2], [3, 4, 4]]), torch.arange(5)
    return (input_ids, *memory, cache_keys, cache_values, positions, sentence_rows, beam_index)


def export_graphs(
    encoder: nn.Module,
    decoder: nn.Module,
    src: Tensor,
    step: tuple[Tensor, ...],
    out_dir: Path,
    decoder_io: DecoderIO = SLOT_DECODER,
) -> tuple[Path, Path]:
    """Trace both wrappers to ``encoder.onnx`` and ``decoder.onnx`` with the layout's names and
    dynamic axes (``onnx_tools.export_onnx``: the TorchScript exporter at opset 17, which keeps
    the shape arithmetic dynamic), then append the candidates' ``TopK`` to the decoder and give
    it one K/V input and output per layer."""
    encoder.eval(), decoder.eval()  # the exporter restores the wrapper's mode, recursively, afterwards
    names = decoder_io.traced_inputs()
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
        tracing_step(step, decoder_io),
        out_dir / "decoder.onnx",
        input_names=names,
        output_names=DECODER_OUTPUTS,
        dynamic_axes=decoder_io.axes(),
    )
    append_top_k(dec_path, LOG_PROBS, TOP_K, *TOP_K_OUTPUTS)
    unstack_layers(dec_path, decoder_io.stacked_inputs(), DECODER_OUTPUTS[1:3])
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
    decoder_io: DecoderIO = SLOT_DECODER,
) -> None:
    """The traced, unoptimised encoder and decoder-step graphs in ``out_dir``."""
    src, step = example_inputs(
        source.n_layers, source.n_heads, source.d_head, source.vocab_size, dtype, source.special.pad
    )
    export_graphs(encoder, decoder, src, step, out_dir, decoder_io)


def _traced(source: TranslationSource, dtype: torch.dtype, out_dir: Path, decoder_io: DecoderIO) -> None:
    encoder, decoder = source.build_graphs(dtype, decoder_io.slots)
    export_raw(source, encoder, decoder, dtype, out_dir, decoder_io)


def build_fp32(source: TranslationSource, out_dir: Path, decoder_io: DecoderIO = SLOT_DECODER) -> None:
    """The traced fp32 graphs in ``out_dir``, unfused (their manifest lists no fusions).

    They are the CPU variants' (fp32, and int8 made from them). Fused, the residual Add and
    LayerNormalization become onnxruntime's ``SkipLayerNormalization``, whose CPU kernel runs
    slower than the two nodes, as in the MiniLM encoder (docs/decisions.md, "The CPU graphs keep
    the plain Add + LayerNormalization and Gelu")."""
    _traced(source, torch.float32, out_dir, decoder_io)


def build_int8(fp32_dir: Path, out_dir: Path) -> dict[str, int]:
    """Per-row int8 graphs (export/graphs/int8_rowwise.py); returns the count of quantised MatMuls."""
    for name in TRANSLATION_GRAPHS:
        quantize_int8(fp32_dir / name, out_dir / name)
    return count_ops(out_dir, ("MatMulIntegerToFloat",))


def build_fp16(source: TranslationSource, out_dir: Path) -> dict[str, int]:
    """The model traced in float16: K/V and hidden states in float16; log_probs and alignments stay
    float32 (the wrappers cast before log-softmax), so scores keep full precision."""
    _traced(source, torch.float16, out_dir, variant_decoder("fp16"))
    return merge_fusions(*(optimize_graph(out_dir / f, source) for f in TRANSLATION_GRAPHS))


def variant_decoder(variant: Variant) -> DecoderIO:
    """The decoder layout a variant is exported with: the in-place slot cache for the CPU variants
    (fp32, int8), the positions layout whose cache the device backend keeps on the GPU for fp16."""
    return POSITIONS_DECODER if variant == "fp16" else SLOT_DECODER


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
    layout = decoder_layout_of(t.name for t in graph_spec(path).inputs)
    if layout is None:
        raise ValueError(f"{path}: the decoder's inputs are those of no layout the service serves")
    return layout
