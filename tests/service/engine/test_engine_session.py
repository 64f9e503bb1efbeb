"""Sessions: provider choice, options and unloadable graphs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from service import cuda
from service.artefacts import ArtefactError
from service.engine import session as sess
from service.engine.session import (
    CPU,
    CUDA,
    ProviderUnavailable,
    SessionConfig,
    create_session,
    resolve_providers,
    session_options,
    spinning,
)


def test_auto_and_cpu_resolve_to_what_onnxruntime_offers(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto takes CUDA only when onnxruntime has it and the driver sees a GPU; CPU is always the
    last fallback."""
    monkeypatch.setattr(cuda, "cuda_devices", lambda: 1)
    monkeypatch.setattr(cuda, "load_cuda_libraries", lambda: None)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CPU])
    assert resolve_providers("auto") == [CPU]
    assert resolve_providers("cpu") == [CPU]
    with pytest.raises(ProviderUnavailable):
        resolve_providers("cuda")
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    providers = resolve_providers("auto", device_id=1)
    assert providers[0][0] == CUDA and providers[0][1]["device_id"] == 1 and providers[-1] == CPU
    # The first GPU is the provider's default: naming it makes onnxruntime-gpu log a warning
    # ("No registered plugin EP device found") for every session.
    assert "device_id" not in resolve_providers("auto")[0][1]
    assert resolve_providers("cpu") == [CPU]
    with pytest.raises(ValueError, match="provider"):
        resolve_providers("tpu")


def test_cuda_sessions_leave_cudnn_flash_attention_off_unless_the_operator_sets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cuDNN's flash attention builds a graph per input shape (45-63 ms each on an H200): CUDA
    turns it off by default, an operator's own value is kept, and the CPU never touches it."""
    monkeypatch.setattr(cuda, "cuda_devices", lambda: 1)
    monkeypatch.setattr(cuda, "load_cuda_libraries", lambda: None)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.delenv(sess.CUDNN_FLASH_ATTENTION, raising=False)
    resolve_providers("cpu")
    assert sess.CUDNN_FLASH_ATTENTION not in os.environ
    resolve_providers("cuda")
    assert os.environ[sess.CUDNN_FLASH_ATTENTION] == "0"
    monkeypatch.setenv(sess.CUDNN_FLASH_ATTENTION, "1")
    resolve_providers("cuda")
    assert os.environ[sess.CUDNN_FLASH_ATTENTION] == "1"


def test_onnxruntime_gpu_without_a_gpu_serves_auto_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-gpu lists CUDA on any machine: with no device the driver reports, auto is the
    CPU and an explicit cuda is refused at once, saying why."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(cuda, "cuda_devices", lambda: 0)
    assert resolve_providers("auto") == [CPU]
    with pytest.raises(ProviderUnavailable, match="no GPU"):
        resolve_providers("cuda")


def test_the_driver_probe_counts_no_gpu_here() -> None:
    """On a machine without the NVIDIA driver (as CI runs) the probe answers 0, not an error."""
    if any(Path(d, "libcuda.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")):
        pytest.skip("an NVIDIA driver is installed here")
    cuda.cuda_devices.cache_clear()
    assert cuda.cuda_devices() == 0


def test_session_options_follow_the_thread_settings() -> None:
    so = session_options(3, 1)
    assert so.intra_op_num_threads == 3 and so.inter_op_num_threads == 1
    assert so.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert not so.enable_mem_pattern
    assert session_options(1, 2).execution_mode == ort.ExecutionMode.ORT_PARALLEL


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_threads_spin_on_the_cpu_only_unless_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA session's CPU threads block between calls (they run only shape ops); a CPU
    session's spin; a configured value wins either way."""
    assert spinning(SessionConfig(), [CPU]) and not spinning(SessionConfig(), [(CUDA, {}), CPU])
    assert not spinning(SessionConfig(allow_spinning=False), [CPU])
    assert spinning(SessionConfig(allow_spinning=True), [(CUDA, {}), CPU])
    off = session_options(1, 1, allow_spinning=False)
    assert off.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    asked: list[bool] = []
    real = sess.session_options

    def recorded(*args: int, allow_spinning: bool) -> ort.SessionOptions:
        asked.append(allow_spinning)
        return real(*args, allow_spinning=allow_spinning)

    monkeypatch.setattr(sess, "session_options", recorded)
    path = tmp_path / "gather.onnx"
    _gather_graph(path)
    monkeypatch.setattr(sess, "resolve_providers", lambda *_: [(CUDA, {}), CPU])
    create_session(path)  # onnxruntime without CUDA runs it on the CPU, as asked second
    monkeypatch.setattr(sess, "resolve_providers", lambda *_: [CPU])
    create_session(path)
    assert asked == [False, True]


def test_an_unloadable_graph_is_an_artefact_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "encoder.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(ArtefactError, match=str(bad)):
        create_session(bad, SessionConfig("cpu", 1))


def test_used_provider_reports_the_session_provider(tmp_path: Path) -> None:
    path = tmp_path / "g.onnx"
    _gather_graph(path)
    s = create_session(path, SessionConfig("auto", 1))
    assert sess.used_provider(s) in (CPU, CUDA)
    sess.warmup(s, {"data_0": np.ones(3, np.float32), "indices": np.array([0], np.int64)})


def test_sessions_share_the_process_cpu_arena(tmp_path: Path) -> None:
    """Every session takes its CPU buffers from the one arena registered in onnxruntime's
    environment (registering it again is a no-op), and runs with it."""
    assert session_options(1, 1).get_session_config_entry("session.use_env_allocators") == "1"
    sess.shared_cpu_arena()
    path = tmp_path / "g.onnx"
    _gather_graph(path)
    x = np.arange(6, dtype=np.float32)
    for _ in range(2):
        out = create_session(path, SessionConfig("cpu", 1)).run(
            None, {"data_0": x, "indices": np.array([4, 1])}
        )
        np.testing.assert_array_equal(out[0], [4.0, 1.0])


def _gather_graph(path: Path) -> Path:
    """``out_0 = Gather(data_0, indices)``: the smallest graph a session loads and runs."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["data_0", "indices"], ["out_0"], axis=0)],
        "gather",
        [
            helper.make_tensor_value_info("data_0", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, ["m"]),
        ],
        [helper.make_tensor_value_info("out_0", TensorProto.FLOAT, ["m"])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _fusable_graph(path: Path) -> Path:
    """x → MatMul → Add(bias) → Gelu → Add(x) → LayerNormalization: what an int8 encoder layer
    looks like to onnxruntime once its MatMuls write (…, N) directly."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "w": rng.normal(size=(8, 8)).astype(np.float32),
        "b": rng.normal(size=8).astype(np.float32),
        "gamma": np.ones(8, np.float32),
        "beta": np.zeros(8, np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["a"]),
            helper.make_node("Gelu", ["a"], ["g"], domain="com.microsoft"),
            helper.make_node("Add", ["g", "x"], ["r"]),
            helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
        ],
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_cpu_sessions_leave_out_the_fusions_slower_on_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BiasGelu and SkipLayerNormalization run slower on the CPU than the nodes they fuse; a CPU
    session keeps the nodes (a plain onnxruntime session fuses them, so the graph is fusable)."""
    onnx = pytest.importorskip("onnx")
    path = _fusable_graph(tmp_path / "g.onnx")

    def optimized_ops(make_session: Callable[[ort.SessionOptions], object]) -> list[str]:
        out = tmp_path / "optimized.onnx"
        out.unlink(missing_ok=True)
        options = session_options(1, 1)
        options.optimized_model_filepath = str(out)
        make_session(options)
        return [n.op_type for n in onnx.load(str(out)).graph.node]

    def ours(options: ort.SessionOptions) -> object:
        monkeypatch.setattr(sess, "session_options", lambda *a, **k: options)
        return create_session(path, SessionConfig("cpu", 1))

    plain = optimized_ops(lambda options: ort.InferenceSession(str(path), options, providers=[CPU]))
    assert "BiasGelu" in plain and "SkipLayerNormalization" in plain
    kept = optimized_ops(ours)
    assert "BiasGelu" not in kept and "SkipLayerNormalization" not in kept
    assert "Gelu" in kept and "LayerNormalization" in kept
