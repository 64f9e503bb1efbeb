"""onnxruntime sessions: one per graph, on the provider the operator asked for.

Creating a session is expensive (graph optimisation, kernel selection), so engines build one
per graph at load time and reuse it for every batch. Shapes change on every call (batch size,
sequence length, cache length), which drives the memory settings below.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from service import cuda
from service.artefacts import ArtefactError, GraphSpec, Manifest
from service.cuda import CUDA

ProviderPref = Literal["auto", "cuda", "cpu"]
CPU = "CPUExecutionProvider"

NUMPY_DTYPE: dict[str, type[np.generic]] = {"float32": np.float32, "int64": np.int64, "float16": np.float16}
# OrtValue.data_type() names → NumPy.
ELEMENT_NUMPY: dict[str, type[np.generic]] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
}


# onnxruntime-gpu's switch for cuDNN's flash attention in its fused Attention op (the embedding and
# rerank graphs have it). On an H200 with onnxruntime-gpu 1.31.1 that kernel built a cuDNN graph
# for every new input shape: 43-74 ms per shape against 5 ms with it off, the same 1.5 ms a batch
# of 32 × 64 once warm. Served batches change shape all the time, so it is off unless the
# operator's environment says otherwise.
CUDNN_FLASH_ATTENTION = "ORT_ENABLE_CUDNN_FLASH_ATTENTION"


class ProviderUnavailable(RuntimeError):
    """``cuda`` was asked for explicitly but onnxruntime cannot use it here."""


def resolve_providers(pref: ProviderPref | str, device_id: int = 0) -> list[Any]:
    """The provider list for ``InferenceSession``, best first, CPU always last as fallback.

    ``auto`` takes CUDA when this onnxruntime build has it (onnxruntime-gpu) and the driver sees
    a GPU; ``cuda`` insists.
    """
    if pref not in ("auto", "cuda", "cpu"):
        raise ValueError(f"provider must be auto, cuda or cpu, got {pref!r}")
    if pref == "cpu" or (pref == "auto" and not cuda.cuda_usable()):
        return [CPU]
    available = ort.get_available_providers()
    if CUDA not in available:
        raise ProviderUnavailable(f"CUDA asked for but onnxruntime offers only {available}")
    if not cuda.cuda_devices():
        raise ProviderUnavailable("CUDA asked for but the NVIDIA driver reports no GPU (or is not installed)")
    cuda.load_cuda_libraries()
    os.environ.setdefault(CUDNN_FLASH_ATTENTION, "0")  # read when the first session is made
    # kSameAsRequested: with dynamic shapes the default power-of-two arena growth wastes memory.
    cuda_options: dict[str, Any] = {"arena_extend_strategy": "kSameAsRequested"}
    if device_id:  # onnxruntime ≥ 1.26 warns once per session when device_id is given at all
        cuda_options["device_id"] = device_id
    return [(CUDA, cuda_options), CPU]


def session_options(
    intra_op_threads: int = 0, inter_op_threads: int = 1, *, allow_spinning: bool = True
) -> ort.SessionOptions:
    """Thread counts (0 = onnxruntime's default, one per core), full graph optimisation.

    Memory patterns are off: they are planned per input shape, and ours change on every call,
    so they would only be recomputed and cached. The CPU arena stays on, as decoding reuses its
    buffers (docs/decisions.md, "Two glibc heaps, one onnxruntime CPU arena"), and is one arena
    for every session of the process (``shared_cpu_arena``). Spinning threads lower latency but
    burn CPU between calls; turn it off on shared hosts.
    """
    so = ort.SessionOptions()
    so.intra_op_num_threads = intra_op_threads
    so.inter_op_num_threads = inter_op_threads
    parallel = inter_op_threads > 1  # inter-op threads only matter when independent nodes run in parallel
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_mem_pattern = False
    so.enable_cpu_mem_arena = True
    shared_cpu_arena()
    so.add_session_config_entry("session.use_env_allocators", "1")
    so.log_severity_level = 3  # errors only; warnings about unused initialisers are noise here
    if not allow_spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


@functools.cache
def shared_cpu_arena() -> None:
    """Register one CPU arena in onnxruntime's environment, for the sessions that opt in.

    Each session otherwise keeps an arena of its own, grown to that graph's peak and never given
    back: a service with several models and encoder/decoder graphs holds the sum of their peaks.
    Shared, the arena holds the peak of what runs at once (the three default models: 325 → 270
    MB resident once idle after translating test2016 with both translators).
    """
    cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(cpu, ort.OrtArenaCfg({}))  # onnxruntime's default arena


@dataclass(frozen=True)
class SessionConfig:
    """How an engine's onnxruntime sessions run; one value from the settings to every graph.

    intra_op_threads 0 is onnxruntime's default (one per core); ``provider`` as in
    ``resolve_providers``; ``device_id`` the CUDA device; ``allow_spinning`` None: as
    ``spinning`` chooses for the provider the session gets.
    """

    provider: ProviderPref | str = "auto"
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    allow_spinning: bool | None = None
    device_id: int = 0


def spinning(config: SessionConfig, providers: list[Any]) -> bool:
    """Whether the session's threads spin between calls: as configured, else on the CPU only.
    A CUDA session's CPU threads run only the shape ops onnxruntime keeps on the host; spinning
    there keeps cores busy that the serving threads (HTTP, tokenizing, the search) need, the
    high CPU use with GPU providers reported in onnxruntime#26847 and #17268."""
    return config.allow_spinning if config.allow_spinning is not None else providers == [CPU]


DEFAULT_SESSION = SessionConfig()


# onnxruntime fusions whose CPU kernels run slower than the nodes they replace (docs/decisions.md,
# "The CPU graphs keep the plain Add + LayerNormalization and Gelu"). They stay on for CUDA.
CPU_SLOWER_FUSIONS = ["BiasGeluFusion", "SkipLayerNormFusion"]


def _slower_on(providers: list[Any]) -> list[str]:
    return CPU_SLOWER_FUSIONS if providers == [CPU] else []


def create_session(path: Path, config: SessionConfig = DEFAULT_SESSION) -> ort.InferenceSession:
    """Load one graph; an unloadable file is an ``ArtefactError`` naming it."""
    providers = resolve_providers(config.provider, config.device_id)
    so = session_options(
        config.intra_op_threads, config.inter_op_threads, allow_spinning=spinning(config, providers)
    )
    try:
        session = ort.InferenceSession(
            str(path), sess_options=so, providers=providers, disabled_optimizers=_slower_on(providers)
        )
    except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/... types
        raise ArtefactError(f"{path}: onnxruntime cannot load it: {e}") from e
    if config.provider == "cuda" and used_provider(session) != CUDA:
        raise ProviderUnavailable(f"{path}: CUDA asked for but the session runs on {used_provider(session)}")
    return session


def used_provider(session: ort.InferenceSession) -> str:
    """The provider that actually runs the graph (CUDA can silently fall back to CPU)."""
    return str(session.get_providers()[0])


def check_io(session: ort.InferenceSession, spec: GraphSpec, path: Path) -> None:
    """The graph must have the inputs and outputs its manifest entry promises."""
    have_in = {i.name for i in session.get_inputs()}
    have_out = {o.name for o in session.get_outputs()}
    missing = [t.name for t in spec.inputs if t.name not in have_in]
    missing += [t.name for t in spec.outputs if t.name not in have_out]
    if missing:
        raise ArtefactError(f"{path}: graph lacks {missing} listed in the manifest")


def open_graph(
    directory: Path, manifest: Manifest, graph: str, config: SessionConfig
) -> tuple[ort.InferenceSession, frozenset[str]]:
    """The session of an artefact's one graph ``graph`` (the embedders' and rerankers'), checked
    against its manifest entry, with the names of the inputs it takes (optional ones may be absent)."""
    if graph not in manifest.graphs:
        raise ArtefactError(f"{directory / 'manifest.json'}: no {graph} graph listed")
    spec = manifest.graphs[graph]
    session = create_session(directory / spec.file, config)
    check_io(session, spec, directory / spec.file)
    return session, frozenset(i.name for i in session.get_inputs())


def warmup(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], runs: int = 2) -> None:
    """Run a few times so the first request does not pay for lazy allocation and kernel tuning."""
    for _ in range(runs):
        session.run(None, dict(feeds))


def device_type(provider: str) -> str:
    """The OrtValue device name for a provider."""
    return "cuda" if provider == CUDA else "cpu"
