"""Graphs over the external-data threshold: weights in ``<graph>.onnx.data`` beside the graph.

The threshold is lowered to 0 bytes, so tiny graphs take the path NLLB-600M's do (protobuf cannot
hold a message over 2 GiB); under it a graph is written as one file, byte for byte as onnx.save.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from export.graphs import external_data
from export.graphs.external_data import copy_graph, data_file, graph_files, initializer_bytes, save_graph
from export.graphs.int8_rowwise import quantize_int8
from export.graphs.onnx_tools import OPSET, append_top_k, optimize, to_fp16
from service.engine.session import SessionConfig, create_session
from tests.export.graphs.test_int8_rowwise import _chain_graph
from tests.export.graphs.test_onnx_tools import matmul_graph, run_cpu


@pytest.fixture
def external(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every graph with initializers goes to external data."""
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_THRESHOLD", 0)


def _wide_matmul(path: Path) -> Path:
    """x (rows, 16) @ W (16, 64) → y (rows, 64): one weight of 4 KiB, over the inline size."""
    weight = np.random.default_rng(4).normal(size=(16, 64)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])],
        "wide",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["rows", 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["rows", 64])],
        [onnx.numpy_helper.from_array(weight, "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_small_graph_stays_one_file_byte_for_byte(tmp_path: Path) -> None:
    model = onnx.load(str(matmul_graph(tmp_path / "g.onnx")))
    save_graph(model, tmp_path / "again.onnx")
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "g.onnx").read_bytes()
    assert not data_file(tmp_path / "again.onnx").exists()
    assert graph_files(tmp_path, "again.onnx") == ["again.onnx"]


def test_large_graph_has_its_weights_beside_it(tmp_path: Path, external: None) -> None:
    single = _chain_graph(tmp_path / "single.onnx")
    model = onnx.load(str(single))
    size = initializer_bytes(model)
    save_graph(model, tmp_path / "g.onnx")
    assert graph_files(tmp_path, "g.onnx") == ["g.onnx", "g.onnx.data"]
    # the tensors of 1 KiB or more (W1, W2: 2 KiB each) are in the data file, W3 (512 B) inline
    assert data_file(tmp_path / "g.onnx").stat().st_size == 2 * 16 * 32 * 4
    assert (tmp_path / "g.onnx").stat().st_size < size
    onnx.checker.check_model(str(tmp_path / "g.onnx"))
    x = np.random.default_rng(0).normal(size=(2, 3, 16)).astype(np.float32)
    np.testing.assert_array_equal(run_cpu(tmp_path / "g.onnx", x), run_cpu(single, x))


def test_rewrite_in_place_replaces_the_data_file(tmp_path: Path, external: None) -> None:
    """onnx appends to an existing data file: saving over a graph starts a new one, so a rewritten
    graph's data file holds its weights once."""
    save_graph(onnx.load(str(_wide_matmul(tmp_path / "single.onnx"))), tmp_path / "g.onnx")
    before = data_file(tmp_path / "g.onnx").stat().st_size
    append_top_k(tmp_path / "g.onnx", "y", "k", "values", "indices")
    assert data_file(tmp_path / "g.onnx").stat().st_size == before
    x = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
    session = create_session(tmp_path / "g.onnx", SessionConfig("cpu", 1, allow_spinning=False))
    y, values, _ = session.run(None, {"x": x, "k": np.array([2])})
    np.testing.assert_array_equal(y, run_cpu(tmp_path / "single.onnx", x))
    np.testing.assert_array_equal(values, -np.sort(-y, axis=-1)[:, :2])


def test_saving_needs_the_data_in_memory(tmp_path: Path, external: None) -> None:
    save_graph(onnx.load(str(_chain_graph(tmp_path / "single.onnx"))), tmp_path / "g.onnx")
    references = onnx.load(str(tmp_path / "g.onnx"), load_external_data=False)
    with pytest.raises(ValueError, match="refers to external data"):
        save_graph(references, tmp_path / "g.onnx")
    assert data_file(tmp_path / "g.onnx").is_file()  # refused before anything was removed


def test_copy_graph_takes_its_data(tmp_path: Path, external: None) -> None:
    save_graph(onnx.load(str(_chain_graph(tmp_path / "single.onnx"))), tmp_path / "g.onnx")
    copy_graph(tmp_path / "g.onnx", tmp_path / "copy" / "g.onnx")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["g.onnx", "g.onnx.data"]
    x = np.random.default_rng(2).normal(size=(1, 4, 16)).astype(np.float32)
    np.testing.assert_array_equal(run_cpu(tmp_path / "copy" / "g.onnx", x), run_cpu(tmp_path / "g.onnx", x))


def test_int8_of_a_large_graph_equals_the_single_file_one(tmp_path: Path, external: None) -> None:
    """The version conversion and shape inference run on the graph without its data: the same
    nodes (shared zero points included) and bit-identical results as from the single file."""
    single = _chain_graph(tmp_path / "single.onnx", width=128)  # int8 W1, W2 of 2 KiB: external
    save_graph(onnx.load(str(single)), tmp_path / "g.onnx")
    quantize_int8(tmp_path / "g.onnx", tmp_path / "q.onnx")
    assert graph_files(tmp_path, "q.onnx") == ["q.onnx", "q.onnx.data"]
    (tmp_path / "one").mkdir()
    external_data.EXTERNAL_DATA_THRESHOLD = 1 << 30  # restored by the fixture's monkeypatch
    quantize_int8(single, tmp_path / "one" / "q.onnx")
    assert graph_files(tmp_path / "one", "q.onnx") == ["q.onnx"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx"), load_external_data=False).graph.node]
    assert ops == [n.op_type for n in onnx.load(str(tmp_path / "one" / "q.onnx")).graph.node]
    assert ops.count("Expand") == 2
    x = np.random.default_rng(3).normal(size=(3, 5, 16)).astype(np.float32)
    np.testing.assert_array_equal(run_cpu(tmp_path / "q.onnx", x), run_cpu(tmp_path / "one" / "q.onnx", x))


def test_copy_within_a_directory_shares_the_data_file(tmp_path: Path, external: None) -> None:
    save_graph(onnx.load(str(_wide_matmul(tmp_path / "single.onnx"))), tmp_path / "g.onnx")
    copy_graph(tmp_path / "g.onnx", tmp_path / "same.onnx")
    assert graph_files(tmp_path, "same.onnx") == ["same.onnx", "g.onnx.data"]
    x = np.random.default_rng(5).normal(size=(2, 16)).astype(np.float32)
    np.testing.assert_array_equal(run_cpu(tmp_path / "same.onnx", x), run_cpu(tmp_path / "single.onnx", x))


def test_optimizer_and_fp16_write_large_graphs_with_their_data(tmp_path: Path, external: None) -> None:
    """onnxruntime's optimiser and fp16 conversion save through its own OnnxModel: same format."""
    save_graph(onnx.load(str(_wide_matmul(tmp_path / "single.onnx"))), tmp_path / "g.onnx")
    optimize(tmp_path / "g.onnx", tmp_path / "fused.onnx", "bert", 1, 16)
    optimize(tmp_path / "g.onnx", tmp_path / "copy" / "g.onnx", "")  # not optimised: copied
    to_fp16(tmp_path / "fused.onnx", tmp_path / "half.onnx")
    x = np.random.default_rng(6).normal(size=(2, 16)).astype(np.float32)
    want = run_cpu(tmp_path / "single.onnx", x)
    for graph in ("fused.onnx", "copy/g.onnx", "half.onnx"):
        path = tmp_path / graph
        assert graph_files(path.parent, path.name) == [path.name, f"{path.name}.data"], graph
        assert data_file(path).stat().st_mode == path.stat().st_mode
        np.testing.assert_allclose(run_cpu(path, x), want, atol=0.05 if graph == "half.onnx" else 0)
