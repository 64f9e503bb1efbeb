"""ONNX helpers shared by the embedding and translation exports (torch → ONNX → variants).

Compatibility target: every graph written here uses **ONNX opset 17** (default domain; int8
graphs 21, for the blocked ``QuantizeLinear`` of export/graphs/int8_rowwise.py) and **IR version
≤ 10**, which onnxruntime 1.20+ loads (1.20 reads IR ≤ 10 and opsets ≤ 21); the
contrib ops the optimizer and quantizer add live in the ``com.microsoft`` domain, version 1.
Every graph is written through export/graphs/external_data.py: one file, or above its threshold
(NLLB-600M's graphs) the graph with its weights in ``<graph>.onnx.data`` beside it. If the legacy
TorchScript exporter ever disappears from torch, :func:`export_onnx` falls back to the dynamo
exporter, which needs opset ≥ 18.

int8 is **per-row**: every activation row (one token of one sentence) gets its own scale, so a
sentence's result does not depend on what shares its batch (see export/graphs/int8_rowwise.py, which
also says why MatMulNBits and onnxruntime's dynamic quantisation were not kept; the figures are
in docs/decisions.md).

Weights are QInt8, symmetric per output column (the u8×s8 VNNI kernels; QUInt8 weights run
slower); only MatMuls with constant weights are quantised (activation×activation
products and the embedding table stay fp32: a gather is not compute). Fusion helps
onnxruntime's CUDA kernels far more than its CPU ones, so the exports keep the plain graph for
fp32/int8 (CPU) and use the fused graph as the base of fp16 (GPU).
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from export.graphs.external_data import copy_graph, needs_external_data, save_checked, save_fused, save_graph
from service.artefacts import MANIFEST_NAME, FileEntry, GraphSpec, TensorSpec, file_entry

if TYPE_CHECKING:  # torch is imported where used: the CLI starts fast
    import torch

OPSET = 17
MAX_IR_VERSION = 10
DYNAMO_MIN_OPSET = 18


# --------------------------------------------------------------------------------------------
# torch → ONNX


def export_onnx(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    opset: int = OPSET,
) -> Path:
    """Export ``module(*args)`` to one ONNX file with named dynamic axes; return ``path``.

    Uses the TorchScript exporter (``dynamo=False``): it gives the plain MatMul/Softmax graphs
    that onnxruntime's optimizer recognises and fuses, at opset 17. ``input_names`` must follow
    the order of ``args``. Trace-time warnings are silenced because the callers verify the
    graph numerically on shapes other than the example's, which is the real test of a trace.
    """
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    module = module.eval()
    common: dict[str, Any] = {
        "input_names": list(input_names),
        "output_names": list(output_names),
        "dynamic_axes": {k: dict(v) for k, v in dynamic_axes.items()},
    }
    # Over 2 GiB the exporters write external data their own way (the TorchScript one a file per
    # tensor), so they write into a directory of their own and the graph is saved from there.
    with tempfile.TemporaryDirectory(prefix=f".{path.name}-", dir=path.parent) as scratch:
        traced = Path(scratch) / path.name
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(
                    module,
                    args,
                    str(traced),
                    opset_version=opset,
                    dynamo=False,
                    do_constant_folding=True,
                    **common,
                )
            except Exception as legacy_error:  # any failure: the other exporter may still work
                print(f"TorchScript ONNX exporter failed ({legacy_error!r}); trying the dynamo exporter")
                torch.onnx.export(
                    module,
                    args,
                    str(traced),
                    opset_version=max(opset, DYNAMO_MIN_OPSET),
                    dynamo=True,
                    external_data=True,
                    **common,
                )
        one_file = [p.name for p in Path(scratch).iterdir()] == [path.name]
        if one_file and not needs_external_data(onnx.load(str(traced), load_external_data=False)):
            shutil.move(traced, path)  # kept byte for byte
        else:
            save_graph(onnx.load(str(traced)), path)
    onnx.checker.check_model(str(path))
    clamp_ir_version(path)
    return path


def clamp_ir_version(path: Path, max_ir: int = MAX_IR_VERSION) -> None:
    """Lower the file's IR version to ``max_ir`` so that onnxruntime 1.20 loads it.

    Newer onnx/onnxruntime tools stamp the newest IR they know even when the graph uses
    nothing beyond IR 8 (opset 17 needs IR ≥ 8); the stamp alone makes older runtimes refuse it.
    """
    model = onnx.load(str(path), load_external_data=False)
    if model.ir_version > max_ir:
        model.ir_version = max_ir
        onnx.save(model, str(path))


def append_top_k(
    path: Path, scores: str, k_input: str, values: str, indices: str, rows_axis: str = "batch"
) -> None:
    """Append a ``TopK`` over the last axis of output ``scores`` to the graph at ``path``, in
    place: a new int64 input ``k_input`` of shape [1] sets k per run, and outputs ``values``
    (float32, best first) and ``indices`` (int64) of shape (``rows_axis``, "top_k") follow
    the existing outputs, which stay as they are."""
    model = onnx.load(str(path))
    graph = model.graph
    graph.input.append(onnx.helper.make_tensor_value_info(k_input, onnx.TensorProto.INT64, [1]))
    graph.node.append(
        onnx.helper.make_node("TopK", [scores, k_input], [values, indices], axis=-1, largest=1, sorted=1)
    )
    shape = [rows_axis, "top_k"]
    graph.output.extend(
        [
            onnx.helper.make_tensor_value_info(values, onnx.TensorProto.FLOAT, shape),
            onnx.helper.make_tensor_value_info(indices, onnx.TensorProto.INT64, shape),
        ]
    )
    save_checked(model, path)


# --------------------------------------------------------------------------------------------
# graph variants


def optimize(
    model_path: Path,
    out_path: Path,
    model_type: str = "bert",
    num_heads: int = 0,
    hidden_size: int = 0,
    *,
    opt_level: int | None = 0,
) -> dict[str, int]:
    """Fuse the graph with onnxruntime's transformer optimizer; return the non-zero fusion counts.

    ``opt_level=0`` runs only the Python fusions (Attention, SkipLayerNormalization, BiasGelu,
    EmbedLayerNormalization…), so the result is portable across CPUs and GPUs; higher levels let
    onnxruntime bake hardware-specific rewrites into the file. ``num_heads``/``hidden_size`` 0
    means "detect from the graph". When the optimizer does not apply (an unknown
    ``model_type``, or an empty one) the graph is copied unchanged and ``{}`` returned.
    """
    from onnxruntime.transformers.optimizer import MODEL_TYPES, optimize_model

    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not model_type or model_type not in MODEL_TYPES:
        if Path(model_path).resolve() != Path(out_path).resolve():
            copy_graph(Path(model_path), Path(out_path))
        return {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = optimize_model(
            str(model_path),
            model_type=model_type,
            num_heads=num_heads,
            hidden_size=hidden_size,
            opt_level=opt_level,
        )
    save_fused(optimized, out_path)
    clamp_ir_version(out_path)
    stats = optimized.get_fused_operator_statistics()
    return {op: int(n) for op, n in stats.items() if n}


def to_fp16(
    in_path: Path,
    out_path: Path,
    *,
    keep_io_types: bool = True,
    op_block_list: Sequence[str] | None = None,
) -> None:
    """Convert weights and activations to float16 (onnxconverter-common's algorithm, via ORT).

    ``keep_io_types=True`` keeps graph inputs/outputs in their fp32/int64 types (casts are
    inserted inside), so the service feeds every variant the same arrays and the manifest's
    GraphSpec still says float32. Give it the fused graph: fused LayerNorm/Attention kernels
    accumulate in fp32, which keeps fp16 accurate. ``op_block_list`` ops stay in fp32.
    """
    from onnxruntime.transformers.onnx_model import OnnxModel

    out_path.parent.mkdir(parents=True, exist_ok=True)
    model = OnnxModel(onnx.load(str(in_path)))
    kwargs: dict[str, Any] = {"keep_io_types": keep_io_types}
    if op_block_list is not None:
        kwargs["op_block_list"] = list(op_block_list)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.convert_float_to_float16(**kwargs)
    save_fused(model, out_path)
    clamp_ir_version(out_path)


# --------------------------------------------------------------------------------------------
# manifest pieces


def _tensor_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
    shape: list[int | str] = []
    for i, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            shape.append(int(dim.dim_value))
        else:
            shape.append(dim.dim_param or f"d{i}")
    return TensorSpec(name=value.name, dtype=dtype, shape=shape)


def graph_spec(path: Path, file: str | None = None) -> GraphSpec:
    """The graph's input/output names, dtypes and shapes as the manifest records them.

    ``path`` is the ONNX file, or the artefact directory when ``file`` names the graph inside
    it; ``file`` (default: the file name) is what GraphSpec.file records, relative to the
    artefact directory. Initializers that older exporters list as inputs are left out.
    """
    path = Path(path)
    onnx_path = path / file if path.is_dir() and file else path
    model = onnx.load(str(onnx_path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [_tensor_spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [_tensor_spec(v) for v in model.graph.output]
    return GraphSpec(file=file or onnx_path.name, inputs=inputs, outputs=outputs)


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default (``ai.onnx``) domain; 0 when it imports none."""
    return int(next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0))


def opset_and_ir(path: Path) -> tuple[int, int]:
    """(default-domain opset, IR version) of an ONNX file, for Manifest.opset/ir_version."""
    model = onnx.load(str(path), load_external_data=False)
    return default_opset(model), int(model.ir_version)


def file_entries(directory: Path, names: Iterable[str] | None = None) -> list[FileEntry]:
    """Manifest.files for ``names`` (relative paths), or for every file under ``directory``.

    Without ``names`` the whole tree is listed (sorted, POSIX separators) except the manifest
    itself and temporary ``*.tmp`` files, so nothing served escapes the sha256 check.
    """
    directory = Path(directory)
    if names is None:
        names = [
            p.relative_to(directory).as_posix()
            for p in directory.rglob("*")
            if p.is_file() and p.name != MANIFEST_NAME and not p.name.endswith(".tmp")
        ]
    return [file_entry(directory, name) for name in sorted(names)]
