"""The ``host`` stage's embedding rows: what a sentence costs the host when the model's compute is free.

The int8 embedding artefact with every session replayed (``replay.py``), on both code paths: the
CPU one, and the device one (the session reports CUDAExecutionProvider, so the engine and the
service take the branches they take on a GPU while the arrays stay here). In-process: the
engine's ``embed`` of 128-sentence batches, in µs of the process's CPU a sentence (on a shared
machine a wall clock also counts the others' work; the wall figure is a column). Over HTTP: the
service with its sessions replayed (``python -m benchmarks.host.replay``) under 4 clients × 128
sentences and 64 clients × 1, in sentences/s, with the server's CPU µs a sentence (over its whole
process tree); and on the device path 64 × 1 again with two serving processes
(``TSERVE_WORKERS=2``, each replaying its own sessions), against one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import Service, load_extra, metered_load, sts_sentences
from benchmarks.harness import Bench
from benchmarks.host.replay import PROVIDER_VARIABLE, replaying
from benchmarks.loadgen import LoadResult
from benchmarks.results import Figure, Row
from service.cuda import CUDA
from service.engine.base import EmbedItem
from service.engine.embedder import OnnxEmbedder
from service.engine.session import CPU, SessionConfig

PATHS = {"CPU": CPU, "device": CUDA}  # a code path → the provider its sessions report
IN_PROCESS = "host, in-process, batch 128: CPU µs a sentence (compute replayed)"
OVER_HTTP = "host, over HTTP: sentences/s (compute replayed)"
BATCH = 128
LEVELS = ((4, 128), (64, 1))  # clients × sentences a request
SEVERAL = 2  # serving processes of the several-process row (device path, 64 × 1)
IN_PROCESS_FIGURES = {"CPU": Figure.HOST_EMBED_IN_PROCESS_CPU, "device": Figure.HOST_EMBED_IN_PROCESS_DEVICE}
HTTP_FIGURES = {  # (path, serving processes, clients, sentences a request)
    ("CPU", 1, 4, 128): Figure.HOST_EMBED_HTTP_4X128_CPU,
    ("device", 1, 4, 128): Figure.HOST_EMBED_HTTP_4X128_DEVICE,
    ("CPU", 1, 64, 1): Figure.HOST_EMBED_HTTP_64X1_CPU,
    ("device", 1, 64, 1): Figure.HOST_EMBED_HTTP_64X1_DEVICE,
    ("device", SEVERAL, 64, 1): Figure.HOST_EMBED_HTTP_64X1_DEVICE_2_PROCESSES,
}


@dataclass(frozen=True)
class HostCost:
    cpu_us: float  # the process's CPU a sentence
    wall_us: float


def replayed_engine(artefact: Path, provider: str) -> OnnxEmbedder:
    """The artefact's engine on one intra-op thread, its session replayed reporting ``provider``,
    its outputs captured by the warm-up."""
    with replaying(provider):
        engine = OnnxEmbedder(artefact, SessionConfig("cpu", 1))
    engine.warmup()
    return engine


def in_process_cost(engine: OnnxEmbedder, sentences: Sequence[str], min_seconds: float) -> HostCost:
    """``engine.embed`` over ``sentences`` in batches of ``BATCH`` (as the OpenAI route asks:
    normalised as the model's pipeline is) until ``min_seconds`` have gone by."""
    normalize = engine.info.normalize
    batches = [
        [EmbedItem(s, normalize=normalize) for s in sentences[i : i + BATCH]]
        for i in range(0, max(len(sentences) - BATCH, 0) + 1, BATCH)
    ]
    engine.embed(batches[0])  # the first call's one-off costs stay out
    t0, c0, done = time.perf_counter(), time.process_time(), 0
    while not done or time.perf_counter() - t0 < min_seconds:
        for batch in batches:
            failed = [r for r in engine.embed(batch) if isinstance(r, Exception)]
            if failed:
                raise failed[0]
            done += len(batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return HostCost(1e6 * cpu / done, 1e6 * wall / done)


def replayed_service(bench: Bench, artefact: Path, path: str, workers: int = 1) -> Service:
    """Our service on ``artefact`` (…/<model>/<variant>) in ``workers`` serving processes, their
    sessions replayed on ``path``."""
    return Service(
        artefact.parent.parent,
        [],
        artefact.parent.name,
        variant=artefact.name,
        threads=bench.threads,
        log=bench.out / f"service-host-{path}-{workers}.log",
        extra_env={
            PROVIDER_VARIABLE: PATHS[path],
            # a 4 × 128 level's requests are over the default limit of texts a request
            "TSERVE_MAX_ITEMS_PER_REQUEST": str(BATCH),
            "TSERVE_WORKERS": str(workers),
        },
        module="benchmarks.host.replay",
    )


def http_load(
    url: str, pid: int, sentences: Sequence[str], clients: int, size: int, duration_s: float
) -> tuple[LoadResult, dict[str, Any]]:
    """One load level on ``/v1/embeddings``: the run and its row's columns, the server's CPU µs a
    sentence among them (of ``pid`` and every process under it: the serving processes and their
    parent where there are several)."""
    n = len(sentences)

    def body(i: int) -> dict[str, Any]:
        return {"input": [sentences[(i * size + j) % n] for j in range(size)]}

    res, cpu = metered_load(
        url, body, [pid], concurrency=clients, items_per_request=size, duration_s=duration_s
    )
    extra = load_extra(res, cpu) | {
        "server_cpu_us_per_sentence": round(1000 * res.server_cpu_ms_per_request / size, 1)
    }
    return res, extra


def run(bench: Bench) -> None:
    """Both paths in-process, then both over HTTP; each figure the best of ``bench.rounds``."""
    artefact = bench.models.get("embed/int8")
    if artefact is None:
        bench.results.note("host embedding rows not measured: no int8 embedding artefact")
        return
    sentences = sts_sentences(bench.args.data_dir)[: 512 if bench.quick else 4096]
    print(f"== host: embeddings with the compute replayed ({len(sentences)} STS-dev sentences)", flush=True)
    for path, provider in PATHS.items():
        engine = replayed_engine(artefact, provider)
        cost = min(
            (in_process_cost(engine, sentences, bench.duration / 2) for _ in range(bench.rounds)),
            key=lambda c: c.cpu_us,
        )
        extra = {"wall_us": round(cost.wall_us, 1), "provider_reported": provider}
        row = Row(IN_PROCESS, f"{path} path", cost.cpu_us, "µs", higher_is_better=False, extra=extra)
        row.figure = IN_PROCESS_FIGURES[path]
        bench.results.add(row)
    if bench.args.no_http:
        return
    for path in PATHS:
        _http_rows(bench, artefact, path, sentences, 1, LEVELS)
    _http_rows(bench, artefact, "device", sentences, SEVERAL, [(64, 1)])


def _http_rows(
    bench: Bench,
    artefact: Path,
    path: str,
    sentences: Sequence[str],
    workers: int,
    levels: Sequence[tuple[int, int]],
) -> None:
    """Each level's row (clients × sentences a request) from a replayed service of ``workers``
    processes, the best of ``bench.rounds``."""
    service = replayed_service(bench, artefact, path, workers)
    try:
        url = f"{service.base}/v1/embeddings"
        for clients, size in levels:
            runs = [
                http_load(url, service.pid, sentences, clients, size, bench.duration)
                for _ in range(bench.rounds)
            ]
            res, extra = max(runs, key=lambda r: r[0].items_per_s)
            processes = f", {workers} processes" if workers > 1 else ""
            system = f"{path} path{processes}, {clients} clients × {size} sent."
            if res.requests == 0:
                bench.results.note(
                    f"host {system}: no successful request ({res.errors} errors: {res.first_error})"
                )
                continue
            row = Row(OVER_HTTP, system, res.items_per_s, "sent/s", extra=extra)
            row.figure = HTTP_FIGURES[path, workers, clients, size]
            bench.results.add(row)
    finally:
        service.stop()
