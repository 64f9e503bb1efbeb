"""The shared ONNX helpers on tiny graphs (milliseconds each)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from export.onnx_tools import (
    MAX_IR_VERSION,
    OPSET,
    clamp_ir_version,
    file_entries,
    graph_spec,
    opset_and_ir,
    optimize,
    quantize_int8,
    to_fp16,
    unstack_layers,
)
from service.engine.session import SessionConfig, create_session


def _matmul_graph(path: Path, ir_version: int = 8) -> Path:
    """x[batch, 16] @ W[16, 8] → y[batch, 8], big enough for the quantizer to bother."""
    weight = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor("w", TensorProto.FLOAT, [16, 8], weight.ravel().tolist())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = ir_version
    onnx.save(model, str(path))
    return path


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return np.asarray(
        create_session(path, SessionConfig("cpu", 1, allow_spinning=False)).run(None, {"x": x})[0]
    )


def test_graph_spec_and_versions(tmp_path: Path) -> None:
    path = _matmul_graph(tmp_path / "g.onnx")
    spec = graph_spec(path)
    assert spec.file == "g.onnx"
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [("x", "float32", ["batch", 16])]
    assert [(t.name, t.dtype, t.shape) for t in spec.outputs] == [("y", "float32", ["batch", 8])]
    assert graph_spec(tmp_path, "g.onnx") == spec  # directory + relative name
    assert opset_and_ir(path) == (OPSET, 8)


def test_clamp_ir_version(tmp_path: Path) -> None:
    path = _matmul_graph(tmp_path / "g.onnx", ir_version=MAX_IR_VERSION + 2)
    clamp_ir_version(path)
    assert opset_and_ir(path) == (OPSET, MAX_IR_VERSION)


def test_quantize_int8_close_to_fp32(tmp_path: Path) -> None:
    fp32 = _matmul_graph(tmp_path / "g.onnx")
    quantize_int8(fp32, tmp_path / "q.onnx")
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert "MatMul" not in ops  # really quantized
    assert opset_and_ir(tmp_path / "q.onnx")[1] <= MAX_IR_VERSION
    x = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
    expected, got = _run(fp32, x), _run(tmp_path / "q.onnx", x)
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()


def test_to_fp16_keeps_io_types(tmp_path: Path) -> None:
    fp32 = _matmul_graph(tmp_path / "g.onnx")
    to_fp16(fp32, tmp_path / "h.onnx")
    spec = graph_spec(tmp_path / "h.onnx")
    assert spec.inputs[0].dtype == "float32" and spec.outputs[0].dtype == "float32"
    weights = onnx.load(str(tmp_path / "h.onnx")).graph.initializer
    assert all(w.data_type == TensorProto.FLOAT16 for w in weights)
    x = np.random.default_rng(1).normal(size=(2, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(tmp_path / "h.onnx", x), _run(fp32, x), rtol=1e-2, atol=1e-2)


def test_optimize_skips_unknown_model_types(tmp_path: Path) -> None:
    fp32 = _matmul_graph(tmp_path / "g.onnx")
    assert optimize(fp32, tmp_path / "o.onnx", model_type="no-such-type") == {}
    assert (tmp_path / "o.onnx").read_bytes() == fp32.read_bytes()


def test_optimize_reports_only_fusions_found(tmp_path: Path) -> None:
    fp32 = _matmul_graph(tmp_path / "g.onnx")
    assert optimize(fp32, tmp_path / "o.onnx", "bert", num_heads=2, hidden_size=16) == {}
    x = np.ones((1, 16), np.float32)
    np.testing.assert_allclose(_run(tmp_path / "o.onnx", x), _run(fp32, x), rtol=1e-6)


def test_file_entries_list_everything_but_the_manifest(tmp_path: Path) -> None:
    (tmp_path / "b.onnx").write_bytes(b"bb")
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("c")
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "manifest.json.tmp").write_text("{}")
    entries = file_entries(tmp_path)
    assert [e.path for e in entries] == ["a.json", "b.onnx", "sub/c.txt"]
    assert entries[1].size == 2 and entries[1].sha256 == hashlib.sha256(b"bb").hexdigest()
    assert [e.path for e in file_entries(tmp_path, ["b.onnx"])] == ["b.onnx"]


def test_export_onnx_dynamic_axes(tmp_path: Path) -> None:
    import torch  # the export world; the other tests here need only onnx/onnxruntime

    from export.onnx_tools import export_onnx

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return x * mask.unsqueeze(-1).float() * 2.0

    path = export_onnx(
        Scale(),
        (torch.ones(2, 3, 4), torch.ones(2, 3, dtype=torch.long)),
        tmp_path / "s.onnx",
        input_names=["x", "mask"],
        output_names=["y"],
        dynamic_axes={
            "x": {0: "batch", 1: "seq"},
            "mask": {0: "batch", 1: "seq"},
            "y": {0: "batch", 1: "seq"},
        },
    )
    assert opset_and_ir(path)[0] == OPSET and opset_and_ir(path)[1] <= MAX_IR_VERSION
    assert graph_spec(path).inputs[1].shape == ["batch", "seq"]
    x = np.random.default_rng(0).normal(size=(5, 7, 4)).astype(np.float32)
    mask = np.ones((5, 7), np.int64)
    mask[1, 3:] = 0
    out = create_session(path, SessionConfig("cpu", 1, allow_spinning=False)).run(
        None, {"x": x, "mask": mask}
    )[0]
    np.testing.assert_allclose(out, x * mask[..., None] * 2.0, rtol=1e-6)


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


def _chain_graph(path: Path) -> Path:
    """h = relu(x @ W1) @ W2 on (batch, seq, ·), then its mean over seq @ W3 on (batch, ·): two
    activations of one leading shape and one of another."""
    rng = np.random.default_rng(2)
    weights = {"w1": (16, 32), "w2": (32, 16), "w3": (16, 8)}
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
    got, want = _run(tmp_path / "q.onnx", x), _run(tmp_path / "g.onnx", x)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    alone, batched = _run(tmp_path / "q.onnx", x[1:2, :3]), _run(tmp_path / "q.onnx", x[:, :3])
    np.testing.assert_array_equal(alone, batched[1:2])


def test_int8_zero_point_per_activation_without_shapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the shapes cannot be inferred, every activation gets a zero point of its own."""
    from export import int8_rowwise

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unknown op")

    monkeypatch.setattr(int8_rowwise.SymbolicShapeInference, "infer_shapes", fail)
    quantize_int8(_chain_graph(tmp_path / "g.onnx"), tmp_path / "q.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert ops.count("QuantizeLinear") == ops.count("Expand") == 3
    x = np.random.default_rng(3).normal(size=(2, 4, 16)).astype(np.float32)
    assert np.all(np.isfinite(_run(tmp_path / "q.onnx", x)))


def _stacked_graph(path: Path, whole_read: bool) -> Path:
    """y = stack(x[0] + 1, x[1] + 1), plus, when ``whole_read``, an output reading x as a whole."""
    nodes, layers = [], []
    for i in range(2):
        nodes += [
            helper.make_node(
                "Constant", [], [f"i{i}"], value=helper.make_tensor(f"i{i}", TensorProto.INT64, [], [i])
            ),
            helper.make_node("Gather", ["x", f"i{i}"], [f"x{i}"], axis=0),
            helper.make_node("Add", [f"x{i}", "one"], [f"y{i}"]),
            helper.make_node("Unsqueeze", [f"y{i}", "zero"], [f"u{i}"]),
        ]
        layers.append(f"u{i}")
    nodes.append(helper.make_node("Concat", layers, ["y"], axis=0))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n", 3])]
    nodes.append(helper.make_node("Shape", ["x"], ["x_shape"]))
    outputs.append(helper.make_tensor_value_info("x_shape", TensorProto.INT64, [3]))
    if whole_read:
        nodes.append(helper.make_node("Neg", ["x"], ["neg"]))
        outputs.append(helper.make_tensor_value_info("neg", TensorProto.FLOAT, [2, "n", 3]))
    graph = helper.make_graph(
        nodes,
        "stacked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n", 3])],
        outputs,
        [
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_unstack_layers_gives_one_input_and_output_per_layer(tmp_path: Path) -> None:
    import onnxruntime as ort

    path = _stacked_graph(tmp_path / "g.onnx", whole_read=False)
    x = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    want_y, want_shape = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    assert unstack_layers(path, ["x"], ["y"]) == 2
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x_0", "x_1"]
    assert [o.name for o in session.get_outputs()] == ["x_shape", "y_0", "y_1"]
    shape, y0, y1 = session.run(None, {"x_0": x[0], "x_1": x[1]})
    np.testing.assert_array_equal(np.stack([y0, y1]), want_y)
    assert shape[1:].tolist() == want_shape[1:].tolist()  # every axis but the layer axis


def test_unstack_layers_refuses_a_graph_that_reads_the_stack_as_a_whole(tmp_path: Path) -> None:
    path = _stacked_graph(tmp_path / "g.onnx", whole_read=True)
    with pytest.raises(ValueError, match="Neg"):
        unstack_layers(path, ["x"], ["y"])
