"""Embeddings: sentence-transformers in-process vs our engine in-process vs HTTP servers.

In-process systems embed the same sentences in the same 32-sentence chunks (sentence-transformers
through its own ``encode(batch_size=32)``, which length-sorts internally; our engine sorts inside
each call). HTTP systems (our service, Infinity) are driven by ``loadgen`` with the same
OpenAI-shaped body ``{"model": …, "input": [...]}`` at 1, 16 and 64 concurrent clients sending
one sentence per request, and with 32-sentence requests.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import CpuMeter, Results, Row, Server, free_port
from benchmarks.loadgen import LoadResult, run_load, wait_ready

BASELINE = "sentence-transformers (in-process)"
SECTION = "embed: sentences/s"


class STInProcess:
    def __init__(self, model_dir: Path, threads: int, name: str = BASELINE, batch: int = 32) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        self.name = name

        torch.set_num_threads(threads)
        self.model = SentenceTransformer(str(model_dir), device="cpu")
        self.batch = batch

    def embed(self, sentences: Sequence[str]) -> None:
        self.model.encode(list(sentences), batch_size=self.batch)


class OursInProcess:
    def __init__(self, artefact_dir: Path, threads: int, name: str, batch: int = 32) -> None:
        from service.engine.loader import load_engine

        self.name = name
        self.engine: Any = load_engine(artefact_dir, provider="cpu", intra_op_threads=threads)
        self.engine.warmup()
        self.batch = batch

    def embed(self, sentences: Sequence[str]) -> None:
        from service.engine.base import EmbedItem

        for i in range(0, len(sentences), self.batch):
            out = self.engine.embed([EmbedItem(s) for s in sentences[i : i + self.batch]])
            bad = [r for r in out if isinstance(r, Exception)]
            if bad:
                raise bad[0]


def in_process(
    systems: Sequence[Any], sentences: Sequence[str], rounds: int
) -> dict[str, tuple[float, float]]:
    """Best (sentences/s, cores used) per system over ``rounds`` runs taken in turn."""
    for s in systems:
        s.embed(sentences[:64])  # warm-up
    best: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        for s in systems:
            t0, c0 = time.perf_counter(), time.process_time()
            s.embed(sentences)
            wall = time.perf_counter() - t0
            run = (len(sentences) / wall, (time.process_time() - c0) / wall)
            if s.name not in best or run[0] > best[s.name][0]:
                best[s.name] = run
    return best


def ours_throughput(artefact_dir: Path, sentences: Sequence[str], threads: int, batch: int = 32) -> float:
    system = OursInProcess(artefact_dir, threads, "ours", batch)
    return in_process([system], sentences, 1)["ours"][0]


@dataclass
class HttpTarget:
    name: str
    url: str
    model: str | None  # the body's "model" field, when the server wants one
    pids: list[int]


def levels(
    clients: Sequence[int] = (1, 16, 64), batch_clients: int = 4, batch: int = 32
) -> list[tuple[str, int, int]]:
    """(label, clients, sentences per request): one-sentence requests, then ``batch``-sentence ones."""
    out = [(f"{c} clients × 1 sent.", c, 1) for c in clients]
    return [*out, (f"{batch_clients} clients × {batch} sent.", batch_clients, batch)]


def http_compare(
    results: Results,
    targets: Sequence[HttpTarget],
    sentences: Sequence[str],
    duration_s: float,
    rounds: int = 1,
) -> dict[str, dict[str, LoadResult]]:
    """Every level on every server, the servers taking turns level by level (both stay up; the
    idle one costs next to nothing), keeping each one's best run; adds one row per run kept."""
    n = len(sentences)
    best: dict[str, dict[str, tuple[LoadResult, dict[str, float]]]] = {t.name: {} for t in targets}
    for label, clients, size in levels():
        for _ in range(rounds):
            for t in targets:

                def body(i: int, size: int = size, model: str | None = t.model) -> dict[str, Any]:
                    start = (i * size) % n
                    return {
                        "input": [sentences[(start + j) % n] for j in range(size)],
                        **({"model": model} if model else {}),
                    }

                with CpuMeter(t.pids).measure() as cpu:
                    res = run_load(
                        t.url, body, concurrency=clients, items_per_request=size, duration_s=duration_s
                    )
                kept = best[t.name].get(label)
                if kept is None or res.items_per_s > kept[0].items_per_s:
                    best[t.name][label] = (res, cpu)
    out: dict[str, dict[str, LoadResult]] = {}
    for t in targets:
        out[t.name] = {}
        for label, (res, cpu) in best[t.name].items():
            out[t.name][label] = res
            if res.requests == 0:
                results.note(
                    f"{t.name} {label}: no successful request ({res.errors} errors: {res.first_error})"
                )
                continue
            extra: dict[str, Any] = {
                "p50_ms": round(res.percentile_ms(50), 1),
                "p99_ms": round(res.percentile_ms(99), 1),
                "server_cores_busy": round(cpu["cores_busy"], 2),
                "machine_busy_pct": round(cpu["machine_busy_pct"], 1),
                "requests": res.requests,
            }
            if res.errors:
                extra["errors"] = res.errors
            results.add(Row(SECTION, f"{t.name}, {label}", res.items_per_s, "sent/s", extra=extra))
    return out


def find_infinity(explicit: Path | None) -> Path | None:
    """The ``infinity_emb`` executable of Infinity's own venv, if installed."""
    candidates = [explicit] if explicit else []
    candidates += [Path(__file__).parent / ".venv-infinity", Path("/tmp/venv-infinity")]
    for venv in candidates:
        if venv is not None and (venv / "bin" / "infinity_emb").is_file():
            return venv / "bin" / "infinity_emb"
    found = shutil.which("infinity_emb")
    return Path(found) if found else None


def start_infinity(exe: Path, model_dir: Path, threads: int, log: Path) -> tuple[Server, str]:
    port = free_port()
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
        "PYTHONPATH": "",
    }
    cmd = [
        str(exe),
        "v2",
        "--model-id",
        str(model_dir),
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "minilm",
        "--log-level",
        "warning",
    ]
    server = Server(cmd, env, log)  # inherits this process's niceness
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{base}/health", 600, server.alive)
    except Exception:
        server.stop()
        raise
    return server, base
