"""Stage speed of the GPU check, decoder steps: where a decode step's time goes on the device.

On an H200 a beam-4 step of our en→de model took about 1.6 ms for one sentence, 2.4 ms for 32 and
3.3 ms for 128, of which the host's search is a fraction (the ``host`` stage of the quick
benchmark): what is left is onnxruntime's own work per decoder run. These rows take one
whole-batch decode, at one sentence and at the largest batch, with the engine's sessions profiled
by onnxruntime (``enable_profiling``), each on an engine of its own that decoded the same batch
once before (so that every shape is warm). Per decoder run: its time (``model_run``), the nodes it
ran, and their time as the profile counts it, which on CUDA is the host's work to launch each
kernel (they run asynchronously); ``node_share``: that over the run's time. A run whose node
time is most of it is bound by launches, which fewer nodes (fused attention) or CUDA graphs
remove; the notes name the op types that take the most.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime as ort

from benchmarks.gpu.ours import BEAM, OursOnDevice
from benchmarks.gpu.quality import split_sentences
from benchmarks.gpu.run import DEVICE_VARIANT, GpuRun
from benchmarks.results import Row
from benchmarks.translators import Workload
from service.engine import session as engine_session
from service.settings import DEFAULT_TRANSLATE_MODELS

TOP_OPS = 6  # op types named in the notes, by node time


@dataclass
class Recorded:
    """The sessions made inside ``profiled``, by graph file stem, and their runs so far."""

    sessions: dict[str, Any] = field(default_factory=dict)
    runs: Counter[str] = field(default_factory=Counter)


@contextmanager
def profiled(folder: Path) -> Iterator[Recorded]:
    """Sessions created inside profile into ``folder`` and count their runs (``run`` and
    ``run_with_iobinding``): onnxruntime's ``InferenceSession`` and the service's session options
    wrapped for the block, restored after."""
    recorded = Recorded()

    original_class, original_options = ort.InferenceSession, engine_session.session_options

    class Recording(original_class):  # type: ignore[misc, valid-type]
        def __init__(self, path: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(path, *args, **kwargs)
            self.graph = Path(str(path)).stem
            recorded.sessions[self.graph] = self

        def run(self, *args: Any, **kwargs: Any) -> Any:
            recorded.runs[self.graph] += 1
            return super().run(*args, **kwargs)

        def run_with_iobinding(self, *args: Any, **kwargs: Any) -> Any:
            recorded.runs[self.graph] += 1
            return super().run_with_iobinding(*args, **kwargs)

    def options(*args: Any, **kwargs: Any) -> Any:
        so = original_options(*args, **kwargs)
        so.enable_profiling = True
        so.profile_file_prefix = str(folder / "session")
        return so

    ort.InferenceSession, engine_session.session_options = Recording, options
    try:
        yield recorded
    finally:
        ort.InferenceSession, engine_session.session_options = original_class, original_options


@dataclass(frozen=True)
class StepProfile:
    runs: int
    ms_per_run: float
    nodes_per_run: float
    node_ms_per_run: float
    top_ops: list[tuple[str, float]]  # op type, ms per run

    def extra(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "nodes_per_run": round(self.nodes_per_run, 1),
            "node_ms_per_run": round(self.node_ms_per_run, 3),
            "node_share": round(self.node_ms_per_run / self.ms_per_run, 2) if self.ms_per_run else None,
        }


def last_runs(events: Sequence[dict[str, Any]], runs: int) -> StepProfile:
    """The profile of a session's last ``runs`` runs, from its onnxruntime profile's events."""
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-runs:]
    if not model_runs:
        raise ValueError("the profile holds no run")
    since = model_runs[0]["ts"]
    nodes = [
        e
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= since
    ]
    by_op: Counter[str] = Counter()
    for e in nodes:
        by_op[e.get("args", {}).get("op_name", "?")] += e["dur"]
    n = len(model_runs)
    return StepProfile(
        runs=n,
        ms_per_run=sum(e["dur"] for e in model_runs) / n / 1e3,
        nodes_per_run=len(nodes) / n,
        node_ms_per_run=sum(e["dur"] for e in nodes) / n / 1e3,
        top_ops=[(op, us / n / 1e3) for op, us in by_op.most_common(TOP_OPS)],
    )


def profile_decode(gpu: GpuRun, texts: Sequence[str]) -> dict[str, StepProfile]:
    """Graph → the profile of its runs in the second of two identical decodes of ``texts``."""
    artefact = gpu.artefacts / DEFAULT_TRANSLATE_MODELS[0] / DEVICE_VARIANT
    workload = Workload(BEAM, len(texts), 64, False)
    with tempfile.TemporaryDirectory() as folder, profiled(Path(folder)) as recorded:
        ours = OursOnDevice(artefact, gpu.provider, "profiled")
        ours.translate(texts, workload)
        recorded.runs.clear()
        ours.translate(texts, workload)
        files = {graph: session.end_profiling() for graph, session in recorded.sessions.items()}
        return {
            graph: last_runs(json.loads(Path(path).read_text()), recorded.runs[graph])
            for graph, path in files.items()
            if recorded.runs[graph]
        }


def run(gpu: GpuRun) -> None:
    """One short sentence and the largest batch, a row of ms per run for each graph; the decoder
    at one sentence is the baseline."""
    texts, _ = split_sentences(gpu.data_dir, "en", "de", max(gpu.sizes.batches))
    short = min(texts, key=len)
    section = f"decoder steps ({gpu.device_label}): onnxruntime's profile of one warm decode, beam 4"
    for batch, sentences in ((1, [short]), (len(texts), texts)):
        profiles = profile_decode(gpu, sentences)
        for graph in ("decoder", "encoder"):
            if (p := profiles.get(graph)) is None:
                continue
            name = f"{graph}, {batch} sentence{'s' if batch > 1 else ''}"
            baseline = graph == "decoder" and batch == 1
            gpu.results.add(Row(section, name, p.ms_per_run, "ms/run", baseline, False, extra=p.extra()))
            ops = ", ".join(f"{op} {ms:.3f}" for op, ms in p.top_ops)
            gpu.results.note(f"{section}: {name}: node ms per run by op type: {ops}")
