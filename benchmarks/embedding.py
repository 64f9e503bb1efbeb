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
from pathlib import Path
from typing import Any

from benchmarks.common import CpuMeter, Results, Row, Server, free_port
from benchmarks.loadgen import LoadResult, run_load, wait_ready

BASELINE = "sentence-transformers (in-process)"
SECTION = "embed: sentences/s"


def st_throughput(model_dir: Path, sentences: Sequence[str], threads: int, batch: int = 32) -> float:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.encode(list(sentences[:64]), batch_size=batch)  # warm-up
    t0 = time.perf_counter()
    model.encode(list(sentences), batch_size=batch)
    return len(sentences) / (time.perf_counter() - t0)


def ours_throughput(artefact_dir: Path, sentences: Sequence[str], threads: int, batch: int = 32) -> float:
    from service.engine.base import EmbedItem
    from service.engine.loader import load_engine

    engine: Any = load_engine(artefact_dir, provider="cpu", intra_op_threads=threads)
    engine.warmup()
    engine.embed([EmbedItem(s) for s in sentences[:batch]])
    t0 = time.perf_counter()
    for i in range(0, len(sentences), batch):
        out = engine.embed([EmbedItem(s) for s in sentences[i : i + batch]])
        bad = [r for r in out if isinstance(r, Exception)]
        if bad:
            raise bad[0]
    return len(sentences) / (time.perf_counter() - t0)


def http_levels(
    results: Results,
    system: str,
    url: str,
    model: str | None,
    sentences: Sequence[str],
    server_pids: Sequence[int],
    duration_s: float,
    levels: Sequence[int] = (1, 16, 64),
    batch_clients: int = 4,
    batch: int = 32,
) -> dict[str, LoadResult]:
    """One-sentence requests at each concurrency level, then ``batch``-sentence requests."""
    n = len(sentences)
    meter = CpuMeter(server_pids)
    out: dict[str, LoadResult] = {}
    runs: list[tuple[str, int, int]] = [(f"{c} clients × 1 sent.", c, 1) for c in levels]
    runs.append((f"{batch_clients} clients × {batch} sent.", batch_clients, batch))
    for label, clients, size in runs:

        def body(i: int, size: int = size) -> dict[str, Any]:
            start = (i * size) % n
            texts = [sentences[(start + j) % n] for j in range(size)]
            return {"input": texts, **({"model": model} if model else {})}

        with meter.measure() as cpu:
            res = run_load(url, body, concurrency=clients, items_per_request=size, duration_s=duration_s)
        out[label] = res
        if res.requests == 0:
            results.note(f"{system} {label}: no successful request ({res.errors} errors: {res.first_error})")
            continue
        extra = {
            "p50_ms": round(res.percentile_ms(50), 1),
            "p99_ms": round(res.percentile_ms(99), 1),
            "server_cores_busy": round(cpu["cores_busy"], 2),
            "machine_busy_pct": round(cpu["machine_busy_pct"], 1),
            "requests": res.requests,
        }
        if res.errors:
            extra["errors"] = res.errors
        results.add(Row(SECTION, f"{system}, {label}", res.items_per_s, "sent/s", extra=extra))
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
