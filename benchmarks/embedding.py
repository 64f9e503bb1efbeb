"""Stage ``embedding``: sentence-transformers in-process vs our engine in-process vs HTTP servers.

In-process systems embed the same sentences in the same 32-sentence chunks (sentence-transformers
through its own ``encode(batch_size=32)``, which length-sorts internally; our engine sorts inside
each call), each both as one call on every thread and as one lane per thread, keeping the
faster (``lane_counts``). HTTP systems (our service, Infinity) are driven by ``loadgen`` with
the same OpenAI-shaped body ``{"model": …, "input": [...]}`` at 1, 16 and 64 concurrent clients
sending one sentence per request, and with 32-sentence requests. Infinity runs from its own
venv, when one is found.
"""

from __future__ import annotations

import gc
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.common import Server, free_port, load_extra, metered_load, rss_mb, sts_sentences
from benchmarks.harness import Bench, Need, Stage
from benchmarks.loadgen import LoadResult, wait_ready
from benchmarks.results import Figure, Results, Row
from service.engine.session import SessionConfig

BASELINE = "sentence-transformers (in-process)"
SECTION = "embed: sentences/s"
OURS_HTTP = "ours HTTP (int8)"
INFINITY = "Infinity (torch)"
FLOOR = "bare handler, same queue and engine (benchmarks/bare_service.py)"  # issue 13's floor

T = TypeVar("T")


class Lanes:
    """``n`` threads side by side, each working through its own share of a call's sentences (the
    caller's thread is the first): how the service's workers run, and on the 2-core box faster
    than one call on every intra-op thread (benchmarks/README.md, "The in-process reference,
    corrected"). With ``threads`` cores, a lane of several gets one intra-op thread, one lane
    all of them."""

    def __init__(self, n: int, threads: int) -> None:
        self.n = n
        self.intra = 1 if n > 1 else threads
        self.label = f"{n} lanes × 1 thread" if n > 1 else f"1 × {threads} threads"
        self._pool = ThreadPoolExecutor(n - 1, thread_name_prefix="lane") if n > 1 else None

    def run(self, work: Callable[[T], object], shares: Sequence[T]) -> None:
        others = [self._pool.submit(work, share) for share in shares[1:]] if self._pool else []
        work(shares[0])
        for lane in others:
            lane.result()


def lane_counts(threads: int) -> list[int]:
    """The lanes each in-process system runs with, its faster kept: 1 (one call on ``threads``
    intra-op threads), and ``threads`` (lanes of one thread each)."""
    return [1, threads] if threads > 1 else [1]


class STInProcess:
    def __init__(
        self, model_dir: Path, threads: int, name: str = BASELINE, batch: int = 32, lanes: int = 1
    ) -> None:
        from sentence_transformers import SentenceTransformer

        self.name = name
        self.lanes = Lanes(lanes, threads)
        self.config = self.lanes.label
        self.model = SentenceTransformer(str(model_dir), device="cpu")
        self.batch = batch

    def embed(self, sentences: Sequence[str]) -> None:
        import torch

        torch.set_num_threads(self.lanes.intra)  # process-wide: the other configuration may have set it
        # each lane's share through encode(), which length-sorts within it
        shares = [sentences[j :: self.lanes.n] for j in range(self.lanes.n)]
        self.lanes.run(lambda share: self.model.encode(list(share), batch_size=self.batch), shares)


class OursInProcess:
    def __init__(self, artefact_dir: Path, threads: int, name: str, batch: int = 32, lanes: int = 1) -> None:
        from service.engine.loader import load_engine

        self.name = name
        self.lanes = Lanes(lanes, threads)
        self.config = self.lanes.label
        self.engine: Any = load_engine(artefact_dir, SessionConfig("cpu", self.lanes.intra))
        self.engine.warmup()
        self.batch = batch

    def embed(self, sentences: Sequence[str]) -> None:
        chunks = [sentences[i : i + self.batch] for i in range(0, len(sentences), self.batch)]
        self.lanes.run(self._embed_chunks, [chunks[j :: self.lanes.n] for j in range(self.lanes.n)])

    def _embed_chunks(self, chunks: Sequence[Sequence[str]]) -> None:
        from service.engine.base import EmbedItem

        for chunk in chunks:
            out = self.engine.embed([EmbedItem(s) for s in chunk])
            bad = [r for r in out if isinstance(r, Exception)]
            if bad:
                raise bad[0]


@dataclass(frozen=True)
class InProcessRun:
    sentences_per_s: float
    cores_used: float
    config: str  # the run's ``Lanes.label``


def in_process(
    systems: Sequence[Any], sentences: Sequence[str], rounds: int, min_seconds: float
) -> dict[str, InProcessRun]:
    """Best run per system name over ``rounds`` runs taken in turn; systems sharing a name are
    one system's configurations, and the faster one's run is kept. A run passes over
    ``sentences`` until ``min_seconds`` have gone by, so that it is a sustained rate like an
    HTTP load level's, not the best of a few bursts of a fraction of a second."""
    for s in systems:
        s.embed(sentences[:64])  # warm-up
    best: dict[str, InProcessRun] = {}
    for _ in range(rounds):
        for s in systems:
            t0, c0, done = time.perf_counter(), time.process_time(), 0
            while not done or time.perf_counter() - t0 < min_seconds:
                s.embed(sentences)
                done += len(sentences)
            wall = time.perf_counter() - t0
            run = InProcessRun(done / wall, (time.process_time() - c0) / wall, s.config)
            if s.name not in best or run.sentences_per_s > best[s.name].sentences_per_s:
                best[s.name] = run
    return best


def ours_in_process(artefact_dir: Path, threads: int, name: str, batch: int = 32) -> list[OursInProcess]:
    """Our engine in each of its configurations (``lane_counts``), all under ``name``."""
    return [OursInProcess(artefact_dir, threads, name, batch, lanes) for lanes in lane_counts(threads)]


def ours_throughput(
    artefact_dir: Path,
    sentences: Sequence[str],
    threads: int,
    min_seconds: float,
    batch: int = 32,
    rounds: int = 1,
) -> InProcessRun:
    return in_process(ours_in_process(artefact_dir, threads, "ours", batch), sentences, rounds, min_seconds)[
        "ours"
    ]


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
    out = [(level_label(c, 1), c, 1) for c in clients]
    return [*out, (level_label(batch_clients, batch), batch_clients, batch)]


def level_label(clients: int, sentences_per_request: int) -> str:
    return f"{clients} clients × {sentences_per_request} sent."


def http_compare(
    results: Results,
    targets: Sequence[HttpTarget],
    sentences: Sequence[str],
    duration_s: float,
    rounds: int = 1,
    figures: dict[tuple[str, str], Figure] | None = None,  # (server, level label) → key
) -> tuple[dict[str, dict[str, LoadResult]], dict[tuple[str, str], Row]]:
    """Every level on every server, the servers taking turns level by level (both stay up; the
    idle one costs next to nothing), keeping each one's best run; adds one row per run kept.
    Returns the runs kept and their rows, both by (server, level label)."""
    figures = figures or {}
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

                res, cpu = metered_load(
                    t.url, body, t.pids, concurrency=clients, items_per_request=size, duration_s=duration_s
                )
                kept = best[t.name].get(label)
                if kept is None or res.items_per_s > kept[0].items_per_s:
                    best[t.name][label] = (res, cpu)
    out: dict[str, dict[str, LoadResult]] = {}
    rows: dict[tuple[str, str], Row] = {}
    for t in targets:
        out[t.name] = {}
        for label, (res, cpu) in best[t.name].items():
            out[t.name][label] = res
            if res.requests == 0:
                results.note(
                    f"{t.name} {label}: no successful request ({res.errors} errors: {res.first_error})"
                )
                continue
            extra = load_extra(res, cpu) | {"requests": res.requests}
            row = Row(
                SECTION,
                f"{t.name}, {label}",
                res.items_per_s,
                "sent/s",
                extra=extra,
                figure=figures.get((t.name, label)),
            )
            rows[t.name, label] = results.add(row)
    return out, rows


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


def run(bench: Bench) -> None:
    """In-process systems, then the HTTP servers, then the in-process ones once more: each keeps its
    best of ``bench.rounds`` runs (in-process: all but one before the HTTP runs, one after)."""
    sents = sts_sentences(bench.args.data_dir)
    n = 512 if bench.quick else len(sents)
    sents = sents[:n]
    print(f"== embeddings ({n} STS-dev sentences)", flush=True)
    model_dir = bench.embed_model_dir
    systems: list[Any] = []
    for lanes in lane_counts(bench.threads):  # each system both ways, its faster kept
        systems += bench.system(partial(STInProcess, lanes=lanes), model_dir, bench.threads, BASELINE)
        for v in ("fp32", "int8"):
            if f"embed/{v}" in bench.models:
                engine = partial(OursInProcess, lanes=lanes)
                systems += bench.system(
                    engine, bench.models[f"embed/{v}"], bench.threads, f"ours in-process ({v})"
                )
    best = in_process(systems, sents, bench.rounds - 1, bench.duration)
    targets: list[HttpTarget] = []
    infinity = floor = None
    if bench.service is not None and "embed/int8" in bench.models:
        targets.append(
            HttpTarget(OURS_HTTP, f"{bench.service.base}/v1/embeddings", None, [bench.service.pid])
        )
        floor = bench.start_service(tag=" (bare handler)", module="benchmarks.bare_service")
        if floor is not None:
            targets.append(HttpTarget(FLOOR, f"{floor.base}/v1/embeddings", None, [floor.pid]))
    if not bench.args.no_infinity:
        exe = find_infinity(bench.args.infinity_venv)
        if exe is None:
            bench.results.note(
                "Infinity not measured: no venv with infinity_emb found (install "
                "`infinity-emb[server,torch]` into benchmarks/.venv-infinity)"
            )
        else:
            try:
                infinity, url = start_infinity(exe, model_dir, bench.threads, bench.out / "infinity.log")
                targets.append(HttpTarget(INFINITY, f"{url}/embeddings", "minilm", [infinity.pid]))
            except Exception as e:
                bench.results.note(f"Infinity failed to start: {type(e).__name__}: {str(e)[:300]}")
    runs: dict[str, dict[str, LoadResult]] = {}
    http_rows: dict[tuple[str, str], Row] = {}
    try:
        if targets:
            print(
                f"   HTTP: {', '.join(t.name for t in targets)} in turn, {bench.duration:.0f} s per run",
                flush=True,
            )
            runs, http_rows = http_compare(
                bench.results,
                targets,
                sents,
                bench.duration,
                bench.rounds,
                figures={
                    (OURS_HTTP, level_label(1, 1)): Figure.EMBED_HTTP_1_CLIENT,
                    (OURS_HTTP, level_label(64, 1)): Figure.EMBED_HTTP_64_CLIENTS,
                    (OURS_HTTP, level_label(4, 32)): Figure.EMBED_HTTP_4_CLIENTS_32,
                    (INFINITY, level_label(64, 1)): Figure.EMBED_INFINITY_64_CLIENTS,
                    (FLOOR, level_label(64, 1)): Figure.EMBED_FLOOR_64_CLIENTS,
                },
            )
        if infinity is not None:
            bench.results.series["infinity_rss_mb"] = rss_mb(infinity.pid)
    finally:
        for server in (infinity, floor):
            if server is not None:
                server.stop()
    # The in-process systems once more, after the HTTP runs: the best of all runs is kept.
    for name, again in in_process(systems, sents, 1, bench.duration).items():
        if name not in best or again.sentences_per_s > best[name].sentences_per_s:
            best[name] = again
    in_process_figures = {
        BASELINE: Figure.EMBED_SENTENCE_TRANSFORMERS,
        "ours in-process (fp32)": Figure.EMBED_OURS_FP32,
        "ours in-process (int8)": Figure.EMBED_OURS_INT8,
    }
    for name, run in best.items():
        bench.results.add(
            Row(
                SECTION,
                name,
                run.sentences_per_s,
                "sent/s",
                baseline=name == BASELINE,
                extra={"batch": 32, "cores_used": round(run.cores_used, 2), "threads": run.config},
                figure=in_process_figures.get(name),
            )
        )
    del systems
    gc.collect()
    for label, _, _ in levels():
        ours, inf = http_rows.get((OURS_HTTP, label)), http_rows.get((INFINITY, label))
        if ours and inf and inf.value:
            ours.extra["x_infinity"] = ours.value / inf.value
    bench.results.series["embed_http"] = {
        name: {k: v.summary() for k, v in r.items()} for name, r in runs.items()
    }
    curves = {name: _curve(r) for name, r in runs.items()}
    if curves:
        bench.results.series["embed_concurrency"] = curves


def _curve(runs: dict[str, LoadResult]) -> dict[str, dict[str, float]]:
    return {
        str(r.concurrency): {
            "items_per_s": r.items_per_s,
            "p50_ms": r.percentile_ms(50),
            "p99_ms": r.percentile_ms(99),
        }
        for r in runs.values()
        if r.items_per_request == 1 and r.requests
    }


STAGE = Stage("embedding", "embedding", frozenset({Need.EMBEDDING, Need.SERVICE}), run)
