"""The shared ONNX helpers on tiny graphs (milliseconds each)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from export.graphs.onnx_tools import (
    MAX_IR_VERSION,
    OPSET,
    clamp_ir_version,
    file_entries,
    graph_spec,
    opset_and_ir,
    optimize,
    to_fp16,
)
from export.graphs.unstack import unstack_layers
from service.engine.session import SessionConfig, create_session


def matmul_graph(path: Path, ir_version: int = 8) -> Path:
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


def run_cpu(path: Path, x: np.ndarray) -> np.ndarray:
    return np.asarray(
        create_session(path, SessionConfig("cpu", 1, allow_spinning=False)).run(None, {"x": x})[0]
    )


def test_graph_spec_and_versions(tmp_path: Path) -> None:
    path = matmul_graph(tmp_path / "g.onnx")
    spec = graph_spec(path)
    assert spec.file == "g.onnx"
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [("x", "float32", ["batch", 16])]
    assert [(t.name, t.dtype, t.shape) for t in spec.outputs] == [("y", "float32", ["batch", 8])]
    assert graph_spec(tmp_path, "g.onnx") == spec  # directory + relative name
    assert opset_and_ir(path) == (OPSET, 8)


def test_clamp_ir_version(tmp_path: Path) -> None:
    path = matmul_graph(tmp_path / "g.onnx", ir_version=MAX_IR_VERSION + 2)
    clamp_ir_version(path)
    assert opset_and_ir(path) == (OPSET, MAX_IR_VERSION)


def test_to_fp16_keeps_io_types(tmp_path: Path) -> None:
    fp32 = matmul_graph(tmp_path / "g.onnx")
    to_fp16(fp32, tmp_path / "h.onnx")
    spec = graph_spec(tmp_path / "h.onnx")
    assert spec.inputs[0].dtype == "float32" and spec.outputs[0].dtype == "float32"
    weights = onnx.load(str(tmp_path / "h.onnx")).graph.initializer
    assert all(w.data_type == TensorProto.FLOAT16 for w in weights)
    x = np.random.default_rng(1).normal(size=(2, 16)).astype(np.float32)
    np.testing.assert_allclose(run_cpu(tmp_path / "h.onnx", x), run_cpu(fp32, x), rtol=1e-2, atol=1e-2)


def test_optimize_skips_unknown_model_types(tmp_path: Path) -> None:
    fp32 = matmul_graph(tmp_path / "g.onnx")
    assert optimize(fp32, tmp_path / "o.onnx", model_type="no-such-type") == {}
    assert (tmp_path / "o.onnx").read_bytes() == fp32.read_bytes()


def test_optimize_reports_only_fusions_found(tmp_path: Path) -> None:
    fp32 = matmul_graph(tmp_path / "g.onnx")
    assert optimize(fp32, tmp_path / "o.onnx", "bert", num_heads=2, hidden_size=16) == {}
    x = np.ones((1, 16), np.float32)
    np.testing.assert_allclose(run_cpu(tmp_path / "o.onnx", x), run_cpu(fp32, x), rtol=1e-6)


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

    from export.graphs.onnx_tools import export_onnx

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
