"""The embedding graph of each variant (``encoder.onnx``, the I/O of ``service.artefacts.EMBEDDING_*``):
fp32 the plain torch export of the source's pooled and normalised vectors (onnxruntime's CPU kernels run it
faster than the offline-fused graph, see export/graphs/onnx_tools.py), int8 its per-row rewrite
(export/graphs/int8_rowwise.py), fp16 built from the fused graph.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import torch

from export.graphs.external_data import save_graph
from export.graphs.int8_rowwise import quantize_int8
from export.graphs.onnx_tools import OPSET, export_onnx, optimize, to_fp16
from export.progress import progress
from export.sources.bert import EmbeddingSource, pooled_module
from service.artefacts import EMBEDDING_OUTPUTS, Variant

EMBEDDING_GRAPH = "encoder.onnx"


def build_fp32(source: EmbeddingSource, path: Path) -> None:
    """The plain torch export of the source's pooled vectors (no fusion: faster on CPU)."""
    names = source.input_names
    # a padded example so that the traced mask path is the general one
    ids = torch.full((2, 8), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    example = (ids, mask, torch.zeros_like(ids))[: len(names)]
    axes = {n: {0: "batch", 1: "sequence"} for n in names} | {n: {0: "batch"} for n in EMBEDDING_OUTPUTS}
    export_onnx(
        pooled_module(source),
        example,
        path,
        input_names=names,
        output_names=list(EMBEDDING_OUTPUTS),
        dynamic_axes=axes,
        opset=OPSET,
    )
    # the tracer names the vectors' width as a symbol of its own; it is the model's dimension
    model = onnx.load(str(path))
    for output in model.graph.output:
        output.type.tensor_type.shape.dim[1].dim_value = source.dim
    save_graph(model, path)


def build_int8(fp32: Path, path: Path) -> dict[str, int]:
    """Per-row int8 (per-row activations, per-column QInt8 weights) of the fp32 graph."""
    quantize_int8(fp32, path)
    return {}


def build_fp16(source: EmbeddingSource, fp32: Path, path: Path, work: Path) -> dict[str, int]:
    """The fp32 graph fused by onnxruntime's BERT optimiser, then converted to float16."""
    fusions = optimize(fp32, work / "fused.onnx", "bert", source.num_heads, source.dim)
    to_fp16(work / "fused.onnx", path)
    return fusions


def build_variant(
    variant: Variant, source: EmbeddingSource, fp32: Path, path: Path, work: Path
) -> dict[str, int]:
    """``variant``'s graph at ``path`` from the fp32 export: copied, quantized or fused to fp16
    (the embedders' and the cross-encoders' alike); → the fusions applied."""
    if variant == "fp32":
        shutil.copyfile(fp32, path)
        return {}
    if variant == "int8":
        progress("  quantizing to int8 (per-row activations, per-column QInt8 weights)")
        return build_int8(fp32, path)
    progress("  fusing (onnxruntime transformer optimizer) and converting to fp16")
    fusions = build_fp16(source, fp32, path, work)
    progress(f"  fusions: {fusions}")
    return fusions
