"""Stage ``serving``: what our service's batching and HTTP layer cost and save.

* dynamic batching vs batch-size-1 serial (the same service with ``TSERVE_MAX_BATCH_SIZE=1``),
  one sentence per request from many clients;
* a document as one request vs its sentences as concurrent requests, and a document sent twice
  to a service with the translation cache (``documents.py``);
* HTTP throughput vs the in-process engine (same artefact, same thread count, batches of the
  service's max batch size; each side the best of ``--rounds`` runs);
* process RSS with both models loaded: after start-up, its peak over every load run of the
  harness, at the end of the last one and once idle (the service trims freed memory when idle);
  CPU use of the server while under load.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from benchmarks.common import SETTLE_S, Service, load_extra, metered_load, sts_sentences
from benchmarks.harness import Bench, Need, Stage
from benchmarks.loadgen import BodyFactory, LoadResult
from benchmarks.results import Figure, Results, Row
from benchmarks.server_account import RoundObserver

DYNAMIC, SERIAL = "dynamic batching (max batch 32)", "batch size 1 (serial)"
TRANSLATE_CLIENTS = 16


@dataclass(frozen=True)
class Task:
    """One item per request from many clients, so that only the queue can combine them."""

    path: str
    section: str
    body: BodyFactory
    clients: int
    dynamic: Figure
    serial: Figure


def load_row(
    results: Results,
    section: str,
    system: str,
    url: str,
    body: BodyFactory,
    pids: Sequence[int],
    *,
    clients: int,
    items: int,
    duration_s: float,
    rounds: int = 1,
    baseline: bool = False,
    figure: Figure | None = None,
    observe: RoundObserver | None = None,
) -> Row | None:
    """The best of ``rounds`` closed-loop load runs as a row of items/s, or None with a note if
    nothing succeeded. ``observe``: a context manager around each round (its index given) whose
    dict holds further columns of that round (server_account.of_service: the server's account)."""
    best: tuple[LoadResult, dict[str, float], dict[str, Any]] | None = None
    for i in range(rounds):
        with observe(i) if observe is not None else nullcontext({}) as observed:
            res, cpu = metered_load(
                url, body, pids, concurrency=clients, items_per_request=items, duration_s=duration_s
            )
        if best is None or res.items_per_s > best[0].items_per_s:
            best = res, cpu, observed
    assert best is not None
    res, cpu, observed = best
    if res.requests == 0:
        results.note(f"{section}: {system}: no successful request ({res.errors} errors: {res.first_error})")
        return None
    extra = load_extra(res, cpu) | observed
    return results.add(
        Row(section, system, res.items_per_s, "items/s", baseline=baseline, extra=extra, figure=figure)
    )


def tasks(bench: Bench) -> list[Task]:
    sents = sts_sentences(bench.args.data_dir)
    src, _ = bench.test_set(1000)
    short = [s for s in src if len(s.split()) <= 10]
    out = []
    if "embed/int8" in bench.models:
        out.append(
            Task(
                "/v1/embeddings",
                "serving: embed, 64 clients × 1 sentence/request",
                lambda i: {"input": [sents[i % len(sents)]]},
                64,
                Figure.EMBED_DYNAMIC,
                Figure.EMBED_SERIAL,
            )
        )
    if "small/int8" in bench.models:
        out.append(
            Task(
                "/v1/translate",
                f"serving: translate, {TRANSLATE_CLIENTS} clients × 1 short sentence/request, beam 4",
                lambda i: {"text": [short[i % len(short)]], "beam_size": 4},
                TRANSLATE_CLIENTS,
                Figure.TRANSLATE_DYNAMIC,
                Figure.TRANSLATE_SERIAL,
            )
        )
    return out


def run_tasks(bench: Bench, service: Service, todo: Sequence[Task], system: str) -> dict[Figure, Row]:
    out = {}
    for task in todo:
        serial = system == SERIAL
        row = load_row(
            bench.results,
            task.section,
            system,
            f"{service.base}{task.path}",
            task.body,
            [service.pid],
            clients=task.clients,
            items=1,
            duration_s=bench.duration,
            rounds=bench.rounds,
            baseline=serial,
            figure=task.serial if serial else task.dynamic,
        )
        if row is not None and row.figure is not None:
            out[row.figure] = row
    return out


def run(bench: Bench) -> None:
    if bench.service is None:
        return
    print("== serving efficiency", flush=True)
    todo = tasks(bench)
    dynamic = run_tasks(bench, bench.service, todo, DYNAMIC)
    if "small/int8" in bench.models:
        from benchmarks.documents import document_rows

        src, _ = bench.test_set(200)
        document_rows(bench.results, bench.service.base, src, [bench.service.pid])
    service = bench.service
    rss_start, rss_end = service.rss_at_start, service.rss_mb()
    rss_settled = service.settled_rss_mb()
    bench.stop_service()  # the peak sampler stops with it
    http_vs_engine(bench, dynamic.get(Figure.EMBED_DYNAMIC))
    serial = bench.start_service({"TSERVE_MAX_BATCH_SIZE": "1"}, " (max batch 1)")
    if serial is not None:
        try:
            run_tasks(bench, serial, todo, SERIAL)
        finally:
            serial.stop()
    if "small/int8" in bench.models:
        from benchmarks.documents import cached_document_rows

        cached_document_rows(bench, bench.test_set(200)[0])
    both = "both models" if len(todo) == 2 else "ONE model only"
    section = f"serving: process RSS ({both} loaded, int8)"
    settled = f"our service, after its load runs, idle {SETTLE_S:g} s"
    rows = (
        ("our service, after start-up", rss_start, None),
        ("our service, peak during all its load runs", service.rss_peak.peak_mb, None),
        ("our service, at the end of its last load run", rss_end, None),
        (settled, rss_settled, Figure.SERVICE_RSS_AFTER_LOAD),  # what it holds once the load is over
    )
    for system, mb, figure in rows:
        bench.results.add(Row(section, system, mb, "MB", higher_is_better=False, figure=figure))
    if "infinity_rss_mb" in bench.results.series:
        bench.results.add(
            Row(
                section,
                "Infinity (embedding model only), after its runs",
                bench.results.series["infinity_rss_mb"],
                "MB",
                higher_is_better=False,
            )
        )


def http_vs_engine(bench: Bench, http: Row | None) -> None:
    """HTTP vs in-process: the same int8 artefact, called directly with the service's max batch,
    on the sentences the HTTP run sends (each STS sentence in turn; until 2026-11-24 the engine
    had the first 1,024 only, 8.3 words on average against 11.5 for all of them), in its faster
    configuration (one call on every thread, or a lane per thread; until 2026-11-24 14:00 the
    first only)."""
    if http is None:
        return
    from benchmarks.embedding import ours_throughput

    sents = sts_sentences(bench.args.data_dir)
    engine = ours_throughput(
        bench.models["embed/int8"], sents, bench.threads, bench.duration, batch=32, rounds=bench.rounds
    )
    section = "serving: embed int8, HTTP (64 clients × 1 sentence) vs in-process engine (batches of 32)"
    bench.results.add(
        Row(
            section,
            "in-process engine",
            engine.sentences_per_s,
            "sent/s",
            baseline=True,
            extra={"threads": engine.config},
            figure=Figure.EMBED_VS_ENGINE_IN_PROCESS,
        )
    )
    bench.results.add(
        Row(
            section,
            "HTTP, 64 clients",
            http.value,
            "sent/s",
            extra=dict(http.extra),
            figure=Figure.EMBED_VS_ENGINE_HTTP,
        )
    )


STAGE = Stage("serving", "serving", frozenset({Need.OUR_CHECKPOINT, Need.EMBEDDING, Need.SERVICE}), run)
