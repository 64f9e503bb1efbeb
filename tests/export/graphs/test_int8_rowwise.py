"""Per-row int8 (export/graphs/int8_rowwise.py) on tiny graphs: batch-independent rows, close to
fp32, one quantised activation per shared input and one zero point per activation shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from export.graphs.int8_rowwise import quantize_int8
from export.graphs.onnx_tools import MAX_IR_VERSION, OPSET, opset_and_ir
from service.engine.session import SessionConfig, create_session
from tests.export.graphs.test_onnx_tools import matmul_graph, run_cpu


def test_quantize_int8_close_to_fp32(tmp_path: Path) -> None:
    fp32 = matmul_graph(tmp_path / "g.onnx")
    quantize_int8(fp32, tmp_path / "q.onnx")
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert "MatMul" not in ops  # really quantized
    assert opset_and_ir(tmp_path / "q.onnx")[1] <= MAX_IR_VERSION
    x = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
    expected, got = run_cpu(fp32, x), run_cpu(tmp_path / "q.onnx", x)
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()


def _rows_graph(path: Path) -> Path:
    """x[batch, seq, 16] @ W[16, 8] (two MatMuls sharing x) → y, z: the shape of a projection."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.normal(size=(16, 8)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["y"], name="q"),
            helper.make_node("MatMul", ["x", "w2"], ["z"], name="k"),
        ],
        "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", 8]) for n in ("y", "z")],
        [
            helper.make_tensor(n, TensorProto.FLOAT, [16, 8], w.ravel().tolist())
            for n, w in (("w1", w1), ("w2", w2))
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_int8_rows_do_not_depend_on_the_batch(tmp_path: Path) -> None:
    """Per-row int8: a row's output is bit-identical alone and next to rows of any magnitude (the
    per-tensor dynamic scheme it replaces fails exactly this), and close to fp32."""
    quantize_int8(_rows_graph(tmp_path / "g.onnx"), tmp_path / "q.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and ops.count("QuantizeLinear") == 1  # x quantised once
    assert "MatMul" not in ops and "DynamicQuantizeLinear" not in ops
    fp32 = create_session(tmp_path / "g.onnx", SessionConfig("cpu", 1, allow_spinning=False))
    q = create_session(tmp_path / "q.onnx", SessionConfig("cpu", 1, allow_spinning=False))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 7, 16)).astype(np.float32)
    x[3] *= 100.0  # a loud neighbour: a shared scale would crush the other rows' resolution
    x[4, 5:] = 0.0  # all-zero rows (padding) stay finite
    batched = q.run(None, {"x": x})
    for row in range(5):
        alone = q.run(None, {"x": x[row : row + 1, :4]})
        for out_b, out_a in zip(batched, alone, strict=True):
            np.testing.assert_array_equal(out_b[row : row + 1, :4], out_a)
    expected = fp32.run(None, {"x": x})
    for got, want in zip(batched, expected, strict=True):
        assert np.all(np.isfinite(got))
        err = np.abs(got - want).max(axis=-1) / np.maximum(np.abs(want).max(axis=-1), 1e-6)
        assert err.max() < 0.03  # each row within 3 % of its own range, the loud one included


def test_int8_excluded_nodes_stay_fp32(tmp_path: Path) -> None:
    assert quantize_int8(_rows_graph(tmp_path / "g.onnx"), tmp_path / "q.onnx", exclude_nodes=["k"]) == 1
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert ops.count("MatMul") == 1 and ops.count("MatMulIntegerToFloat") == 1


def _chain_graph(path: Path, width: int = 32) -> Path:
    """h = relu(x @ W1) @ W2 on (batch, seq, ·), then its mean over seq @ W3 on (batch, ·): two
    activations of one leading shape and one of another; ``width`` is h's."""
    rng = np.random.default_rng(2)
    weights = {"w1": (16, width), "w2": (width, 16), "w3": (16, 8)}
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"], name="up"),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["h"], name="down"),
            helper.make_node("ReduceMean", ["h"], ["m"], axes=[1], keepdims=0),
            helper.make_node("MatMul", ["m", "w3"], ["y"], name="head"),
        ],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [
            helper.make_tensor(n, TensorProto.FLOAT, list(shape), rng.normal(size=shape).ravel().tolist())
            for n, shape in weights.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_int8_zero_point_made_once_per_activation_shape(tmp_path: Path) -> None:
    """The blocked zero point has the scale's shape: activations whose leading dimensions are the
    same symbols share one (Shape + Expand), the rest get their own; the result is unchanged."""
    quantize_int8(_chain_graph(tmp_path / "g.onnx"), tmp_path / "q.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert ops.count("QuantizeLinear") == 3
    assert ops.count("Expand") == ops.count("Shape") == 2  # (batch, seq, 1) and (batch, 1)
    x = np.random.default_rng(3).normal(size=(3, 5, 16)).astype(np.float32)
    got, want = run_cpu(tmp_path / "q.onnx", x), run_cpu(tmp_path / "g.onnx", x)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    alone, batched = run_cpu(tmp_path / "q.onnx", x[1:2, :3]), run_cpu(tmp_path / "q.onnx", x[:, :3])
    np.testing.assert_array_equal(alone, batched[1:2])


def test_int8_zero_point_per_activation_without_shapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the shapes cannot be inferred, every activation gets a zero point of its own."""
    from export.graphs import int8_rowwise

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unknown op")

    monkeypatch.setattr(int8_rowwise.SymbolicShapeInference, "infer_shapes", fail)
    quantize_int8(_chain_graph(tmp_path / "g.onnx"), tmp_path / "q.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert ops.count("QuantizeLinear") == ops.count("Expand") == 3
    x = np.random.default_rng(3).normal(size=(2, 4, 16)).astype(np.float32)
    assert np.all(np.isfinite(run_cpu(tmp_path / "q.onnx", x)))
