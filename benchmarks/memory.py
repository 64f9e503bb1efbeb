"""Stage ``memory``: resident memory of one service with ``make serve``'s three default models.

One fresh service (int8, CPU) serves both default translators and the embedding model. Its load,
each phase from 8 clients, every request answered before the next phase starts: Multi30k
``test_2016_flickr`` translated by each translator (its source side: English for en→de, German
for de→en) at beam 4, then greedy, in requests of 32 sentences; then every STS-dev sentence
embedded in requests of 64. Reported: resident memory after start-up, the peak over the whole
load (the kernel's high-water mark, ``VmHWM``, so no spike is missed between samples) and once
idle (the service gives freed memory back when idle). Issue 16's bound is on the peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.common import SETTLE_S, Service, peak_rss_mb, read_lines, sts_sentences
from benchmarks.harness import EMBED_NAME, Bench, Need, Stage
from benchmarks.loadgen import run_load
from benchmarks.results import Figure, Row
from service.artefacts import read_manifest
from service.settings import DEFAULT_TRANSLATE_MODELS

CLIENTS = 8
TRANSLATE_BATCH = 32
EMBED_BATCH = 64
SECTION = "memory: process RSS, the three default models (int8), translating and embedding"


@dataclass(frozen=True)
class Phase:
    name: str
    path: str
    bodies: list[dict[str, Any]]  # one request each, every one sent once


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def phases(translators: dict[str, list[str]], sentences: list[str]) -> list[Phase]:
    """The load, in order: each translator (name → its source sentences) at beam 4 then greedy,
    then the embeddings."""
    out = [
        Phase(
            f"{name}, beam {beam}",
            "/v1/translate",
            [{"text": texts, "model": name, "beam_size": beam} for texts in chunks(source, TRANSLATE_BATCH)],
        )
        for name, source in translators.items()
        for beam in (4, 1)
    ]
    bodies = [{"input": texts, "model": EMBED_NAME} for texts in chunks(sentences, EMBED_BATCH)]
    out.append(Phase(f"{EMBED_NAME}, {len(sentences)} sentences", "/v1/embeddings", bodies))
    return out


def drive(base_url: str, phase: Phase) -> float:
    """Send every request of ``phase`` to the server at ``base_url`` once, from ``CLIENTS``
    clients; its seconds. Raises if any request failed: a figure under a load that was not
    served would mean nothing."""
    res = run_load(
        f"{base_url}{phase.path}",
        phase.bodies.__getitem__,
        concurrency=min(CLIENTS, len(phase.bodies)),
        n_requests=len(phase.bodies),
        timeout_s=600,
        warm_up=False,
    )
    if res.errors:
        raise RuntimeError(f"{phase.name}: {res.errors} requests failed, the first: {res.first_error}")
    return res.seconds


def source_language(bench: Bench, name: str) -> str:
    translation = read_manifest(bench.models[f"{name}/int8"]).translation
    assert translation is not None, f"{name} is not a translation artefact"
    return translation.source_languages[0]


def run(bench: Bench) -> None:
    names = [name for name in DEFAULT_TRANSLATE_MODELS if f"{name}/int8" in bench.models]
    if len(names) < len(DEFAULT_TRANSLATE_MODELS) or "embed/int8" not in bench.models:
        bench.results.note("memory not measured: an int8 export of a default model is missing")
        return
    source = {
        name: read_lines(bench.multi30k / f"test_2016_flickr.{source_language(bench, name)}.gz")
        for name in names
    }
    load = phases(source, sts_sentences(bench.args.data_dir))
    print("== memory: the three default models", flush=True)
    service = Service(
        bench.artefacts,
        names,
        EMBED_NAME,
        variant="int8",
        threads=bench.threads,
        log=bench.out / "service-memory.log",
    )
    try:
        seconds = sum(drive(service.base, phase) for phase in load)
        peak = peak_rss_mb(service.pid)
        idle = service.settled_rss_mb()
    finally:
        service.stop()
    rows = (
        ("after start-up", service.rss_at_start, None),
        ("peak over the load (VmHWM)", peak, Figure.SERVICE_RSS_THREE_MODELS_PEAK),
        (f"after the load, idle {SETTLE_S:g} s", idle, None),
    )
    for system, mb, figure in rows:
        extra = {"load_s": round(seconds, 1)} if figure is Figure.SERVICE_RSS_THREE_MODELS_PEAK else {}
        bench.results.add(Row(SECTION, system, mb, "MB", higher_is_better=False, extra=extra, figure=figure))


STAGE = Stage("memory", "memory", frozenset({Need.DEFAULT_TRANSLATORS, Need.EMBEDDING}), run)
