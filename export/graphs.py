"""The ONNX graphs of each variant, for both tasks: traced from a source, then optimised,
quantised or converted (the export's second stage; export/onnx_tools.py has the tools).

* Translation (a ``TranslationSource``, graphs with the I/O of ``export.translation_graphs``):
  fp32 the plain traced graphs (onnxruntime's CPU ``SkipLayerNormalization``, the one fusion
  the optimiser made in them, ran slower than the Add + LayerNormalization it replaces: see
  ``build_fp32``); int8 the fp32 graphs' per-row rewrite (export/int8_rowwise.py); fp16 traced
  in float16 and optimised with onnxruntime's encoder-decoder fusions.
* Embedding (an ``EmbeddingSource``, ``encoder.onnx``): fp32 the plain torch export
  (onnxruntime's CPU kernels run it faster than the offline-fused graph, see
  export/onnx_tools.py), int8 its per-row rewrite, fp16 built from the fused graph.

Each builder returns the fusion counts the manifest records.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

from export.onnx_tools import OPSET, export_onnx, graph_spec, optimize, quantize_int8, to_fp16
from export.publish import progress
from export.sources import TranslationSource
from export.sources.bert import EmbeddingSource, hidden_states_module
from export.translation_graphs import (
    DEFAULT_DECODER_LAYOUT,
    DEVICE_DECODER_LAYOUT,
    example_inputs,
    export_graphs,
)
from service.artefacts import EMBEDDING_OUTPUT, DecoderLayout, Variant, decoder_layout_of

TRANSLATION_GRAPHS = ("encoder.onnx", "decoder.onnx")
EMBEDDING_GRAPH = "encoder.onnx"

# --- translation ----------------------------------------------------------------------------------


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
    LayerNormalization become onnxruntime's ``SkipLayerNormalization``, whose CPU kernel ran
    slower than the two nodes, as in the MiniLM encoder (en→de int8 at beam 4 / batch 32: 4–26 %
    in 7 of 8 alternating runs; benchmarks/README.md, "The CPU translation graphs unfused")."""
    _traced(source, torch.float32, out_dir, layout)


def build_int8(fp32_dir: Path, out_dir: Path) -> dict[str, int]:
    """Per-row int8 graphs (export/int8_rowwise.py); returns the count of quantised MatMuls."""
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


# --- embedding ------------------------------------------------------------------------------------


def embedding_fp32(source: EmbeddingSource, path: Path) -> None:
    """The plain torch export of the source's hidden states (no fusion: faster on CPU)."""
    names = source.input_names
    # a padded example so that the traced mask path is the general one
    ids = torch.full((2, 8), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    example = (ids, mask, torch.zeros_like(ids))[: len(names)]
    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, EMBEDDING_OUTPUT]}
    export_onnx(
        hidden_states_module(source),
        example,
        path,
        input_names=names,
        output_names=[EMBEDDING_OUTPUT],
        dynamic_axes=axes,
        opset=OPSET,
    )


def embedding_int8(fp32: Path, path: Path) -> dict[str, int]:
    """Per-row int8 (per-row activations, per-column QInt8 weights) of the fp32 graph."""
    quantize_int8(fp32, path)
    return {}


def embedding_fp16(source: EmbeddingSource, fp32: Path, path: Path, work: Path) -> dict[str, int]:
    """The fp32 graph fused by onnxruntime's BERT optimiser, then converted to float16."""
    fusions = optimize(fp32, work / "fused.onnx", "bert", source.num_heads, source.dim)
    to_fp16(work / "fused.onnx", path)
    return fusions
