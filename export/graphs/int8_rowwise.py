"""int8 whose result does not depend on the batch: every activation row quantised on its own.

onnxruntime's dynamic quantisation (``DynamicQuantizeLinear`` → ``MatMulInteger``, fused into
``DynamicQuantizeMatMul``) picks **one** scale for the whole activation tensor, i.e. for every
token of every sentence in the batch, so a sentence's numbers (and, near a tie, its translation)
change with whatever shares its batch. This rewrite gives each row of the activation (one token
of one sentence, the last axis) its own symmetric scale:

    A (…, K)
    s = max(|A|, axis=-1) / 127                                  (…, 1)  per-row scale
    q = QuantizeLinear(A, s, 128, axis=-1, block_size=K)         (…, K)  uint8, one block a row
    Y = MatMulIntegerToFloat(q, W_int8, s, w_scale, 128)         (…, N)

(``MatMulIntegerToFloat`` is ``(q - 128) @ W_int8`` in exact int32, times the broadcast product
of the two scales. Its documentation names only a scalar or per-column ``a_scale``; the CPU kernel
broadcasts a (…, 1) one over the output rows, which is what makes one fused kernel per MatMul
possible. tests/export/graphs/test_int8_rowwise.py and every export's alone-vs-batched and parity checks
guard that for the onnxruntime in use, which the manifest records. The int8 variant is for the
CPU; GPUs serve fp16. Bias Adds stay separate: with a non-scalar ``a_scale`` the kernel
multiplies its ``bias`` input by the row scale too. Q/K/V projections share one quantised
activation.)

``W_int8`` is symmetric per output column (QInt8, what the u8×s8 VNNI kernels want), in 7 bits
(``INT8_WEIGHT_BITS``: exact on CPUs without VNNI too, whose kernels saturate 8-bit weights); the row
scale is the only thing computed from the activation, and it depends on that row alone. The
integer product is exact and the scaling element-wise, so a row's result is bit-identical
whatever the number of rows: tested by ``export.verify.determinism``.

One row is one block of opset 21's blocked ``QuantizeLinear``, so the activation keeps its shape:
5 nodes per quantised activation and 1 per MatMul, where opset 17's per-axis form needed a
reshape to (M, K), a flattened scale and a reshape back (11 + 3), so the decoder step has fewer
nodes and runs faster. The rewrite converts the graph to opset 21 first (onnx's version
converter; the fp32 and fp16 variants stay at 17). The zero point 128 is a uint8 tensor of the
scale's shape (a blocked zero point must match it): int8 activations with no zero point run
far slower, onnxruntime having no fast s8×s8 CPU kernel. It is made (Shape + Expand)
once per activation shape, not once per activation: onnxruntime's symbolic shape inference names
every activation's leading dimensions, and the decoder step's all read (rows, 1), the encoders'
(batch, length), which leaves fewer nodes still. With the MatMul's output no
longer behind a Reshape, onnxruntime's CPU session would fuse the bias Add with Gelu and the
residual Add with LayerNormalization into kernels slower than the nodes they replace;
``service/engine/session.py`` turns those two fusions off.

Why this and not the alternatives (their figures are in docs/decisions.md):

* ``MatMulNBits`` 8-bit, ``accuracy_level=4`` (int8 compute, activations quantised per block of
  32/64/128 along K): block 32 was batch-independent and the most accurate, but decoding ran no
  faster than fp32; with blocks 64/128 a sentence's output changed
  with its batch (1 of 32 translations), so they do not meet the contract.
* ``MatMulInteger`` with a per-row ``a_zero_point`` (asymmetric per-row): the CPU kernel accepts
  only a scalar zero point. Symmetric rows need only the scalar 128, which it takes.
* ``DynamicQuantizeMatMul``: computes its own per-tensor activation scale, the problem itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

from export.graphs.external_data import save_graph
from export.graphs.onnx_tools import clamp_ir_version, default_opset
from service.artefacts import INT8_WEIGHT_BITS

INT8_MAX = 127.0
WEIGHT_MAX = float(2 ** (INT8_WEIGHT_BITS - 1) - 1)  # 63: exact on CPUs without VNNI too
ZERO_POINT = 128  # uint8 offset that makes a symmetric int8 value unsigned (u8×s8 kernels)
MIN_SCALE = 1e-12  # an all-zero row (e.g. a padded position) quantises to zeros, not NaN
MS_DOMAIN = "com.microsoft"
BLOCKED_QUANTIZE_OPSET = 21  # QuantizeLinear's block_size
BLOCKED_QUANTIZE_IR = 10


def quantize_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) float → (int8 (K, N), per-column float32 scales (N,)), symmetric."""
    scale = np.maximum(np.abs(weight).max(axis=0), MIN_SCALE).astype(np.float32) / np.float32(WEIGHT_MAX)
    q = np.clip(np.rint(weight / scale), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8)
    return q, scale


class _Rewriter:
    def __init__(self, model: onnx.ModelProto, leading_dims: dict[str, tuple[str | int, ...]]) -> None:
        self.model = model
        self.graph = model.graph
        self.leading_dims = leading_dims
        self.zero_points: dict[tuple[str | int, ...], str] = {}
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.consumers: dict[str, int] = {}
        for node in self.graph.node:
            for name in node.input:
                self.consumers[name] = self.consumers.get(name, 0) + 1
        self.new_initializers: list[onnx.TensorProto] = []
        self.shared: dict[str, str] = {}
        self.quantized: dict[str, tuple[str, str]] = {}

    def constant(self, name: str, value: np.ndarray) -> str:
        if name not in self.shared:
            self.new_initializers.append(numpy_helper.from_array(value, name))
            self.shared[name] = name
        return name

    def weight(self, node: onnx.NodeProto) -> np.ndarray | None:
        tensor = self.initializers.get(node.input[1])
        if tensor is None or tensor.data_type != TensorProto.FLOAT or len(tensor.dims) != 2:
            return None
        return numpy_helper.to_array(tensor)

    def quantized_input(self, x: str, k: int) -> tuple[list[onnx.NodeProto], str, str]:
        """Nodes quantising activation ``x`` (…, K) per row, once however many MatMuls read it
        (Q/K/V projections share theirs); returns (nodes, q (…, K) uint8, scale (…, 1))."""
        if x in self.quantized:
            q, s = self.quantized[x]
            return [], q, s
        p = f"rowq_in{len(self.quantized)}"
        last_axis = self.constant("rowq_last_axis", np.array([-1], dtype=np.int64))
        inv_max = self.constant("rowq_inv_int8_max", np.array(1.0 / INT8_MAX, dtype=np.float32))
        min_scale = self.constant("rowq_min_scale", np.array(MIN_SCALE, dtype=np.float32))
        nodes = [
            helper.make_node("Abs", [x], [f"{p}_abs"]),
            helper.make_node("ReduceMax", [f"{p}_abs", last_axis], [f"{p}_absmax"], keepdims=1),
            helper.make_node("Mul", [f"{p}_absmax", inv_max], [f"{p}_s_raw"]),
            helper.make_node("Max", [f"{p}_s_raw", min_scale], [f"{p}_s"]),  # (…, 1)
        ]
        zp_nodes, zp = self.zero_point_like(x, f"{p}_s")
        nodes += zp_nodes
        # one block = one whole row: a scale per row, no reshape to (M, K) and back
        nodes.append(helper.make_node("QuantizeLinear", [x, f"{p}_s", zp], [f"{p}_q"], axis=-1, block_size=k))
        self.quantized[x] = (f"{p}_q", f"{p}_s")
        return nodes, f"{p}_q", f"{p}_s"

    def zero_point_like(self, x: str, scale: str) -> tuple[list[onnx.NodeProto], str]:
        """The zero point 128 in the shape of ``scale`` (a blocked zero point has the scale's
        shape), made once per shape: activations whose leading dimensions are the same symbols
        share it, as the decoder's (rows, 1, ·) or the encoder's (batch, length, ·) all do."""
        dims = self.leading_dims.get(x)
        if dims is not None and dims in self.zero_points:
            return [], self.zero_points[dims]
        zp = f"{scale}_zp"
        zero_point = self.constant("rowq_zero_point", np.array(ZERO_POINT, dtype=np.uint8))
        nodes = [
            helper.make_node("Shape", [scale], [f"{scale}_shape"]),
            helper.make_node("Expand", [zero_point, f"{scale}_shape"], [zp]),
        ]
        if dims is not None:
            self.zero_points[dims] = zp
        return nodes, zp

    def rewrite(self, node: onnx.NodeProto, weight: np.ndarray, index: int) -> list[onnx.NodeProto]:
        """``node`` (MatMul of an activation by ``weight``) as per-row int8 nodes, same output name."""
        p = f"rowq{index}"
        q_w, w_scale = quantize_weight(weight)
        w_name = self.constant(f"{p}_w_int8", q_w)
        w_scale_name = self.constant(f"{p}_w_scale", w_scale)
        zero_point = self.constant("rowq_zero_point", np.array(ZERO_POINT, dtype=np.uint8))
        nodes, q, s = self.quantized_input(node.input[0], weight.shape[0])
        nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                [q, w_name, s, w_scale_name, zero_point],
                [node.output[0]],
                domain=MS_DOMAIN,
            )
        )
        for new in nodes:
            new.name = f"{node.name or p}/{new.op_type}_{new.output[0]}"
        return nodes

    def run(self, exclude: set[str]) -> int:
        new_nodes: list[onnx.NodeProto] = []
        rewritten = 0
        for node in self.graph.node:
            weight = self.weight(node) if node.op_type == "MatMul" and node.name not in exclude else None
            if weight is None:
                new_nodes.append(node)
                continue
            new_nodes.extend(self.rewrite(node, weight, rewritten))
            self.consumers[node.input[1]] -= 1
            rewritten += 1
        unused = {name for name, uses in self.consumers.items() if uses == 0 and name in self.initializers}
        kept = [t for t in self.graph.initializer if t.name not in unused]
        del self.graph.node[:]
        self.graph.node.extend(new_nodes)
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept + self.new_initializers)
        return rewritten


def _leading_dims(model: onnx.ModelProto) -> dict[str, tuple[str | int, ...]]:
    """Every tensor's dimensions but the last, where onnxruntime's symbolic shape inference knows
    them all (named symbols or numbers); tensors it cannot resolve are left out."""
    try:
        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # an op it does not know: every activation gets its own zero point
        return {}
    dims: dict[str, tuple[str | int, ...]] = {}
    for info in [*inferred.graph.value_info, *inferred.graph.input]:
        tensor = info.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        shape = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in tensor.shape.dim]
        known = [d for d in shape[:-1] if d is not None]
        if shape and len(known) == len(shape) - 1:
            dims[info.name] = tuple(known)
    return dims


def quantize_rowwise(in_path: Path, out_path: Path, exclude_nodes: set[str] | None = None) -> int:
    """Rewrite every MatMul with a constant 2-D float weight as per-row int8; return how many.

    The version converter and the shape inference serialise the model, which protobuf cannot do
    over 2 GiB: they run on the graph as loaded without its external data (a large graph's weights
    stay references; shapes and small constants are in the graph file), and the weights are read
    in afterwards. A single-file graph is loaded whole from the start."""
    model = onnx.load(str(in_path), load_external_data=False)
    if default_opset(model) < BLOCKED_QUANTIZE_OPSET:
        model = version_converter.convert_version(model, BLOCKED_QUANTIZE_OPSET)
        model.ir_version = max(model.ir_version, BLOCKED_QUANTIZE_IR)
    leading_dims = _leading_dims(model)
    onnx.external_data_helper.load_external_data_for_model(model, str(in_path.parent))
    count = _Rewriter(model, leading_dims).run(exclude_nodes or set())
    if count and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_graph(model, out_path)
    return count


def quantize_int8(in_path: Path, out_path: Path, *, exclude_nodes: Sequence[str] = ()) -> int:
    """Per-row int8 as a checked file of the supported IR: weights QInt8 per output column, each
    activation row quantised with its own scale at run time; returns the number of MatMuls
    quantised. ``exclude_nodes`` names MatMul nodes to keep in fp32."""
    count = quantize_rowwise(in_path, out_path, set(exclude_nodes))
    onnx.checker.check_model(str(out_path))
    clamp_ir_version(out_path)
    return count
