"""A document as one request against its sentences as as many concurrent one-sentence requests,
and a document sent twice to a service with the translation cache.

The same 200 test-set sentences go to ``POST /v1/translate`` twice: once as one document
(paragraphs of five sentences separated by blank lines), once as 200 one-sentence requests all
in flight together. Both are sentences in the same dynamic queue; the document saves the
per-request HTTP, validation and JSON cost. Sentences/s of each, and the document's latency.
The benchmark's services run without the translation cache (benchmarks/common.py), as these
rows send the same sentences again; ``cached_document_rows`` starts one with it, sends the
document twice and sets the second time (every sentence from the cache) against the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import httpx

from benchmarks.common import load_extra, metered_load
from benchmarks.harness import Bench
from benchmarks.loadgen import BodyFactory
from benchmarks.results import Results, Row
from service.settings import Settings

SECTION = "serving: translate 200 sentences, beam 4: one document vs 200 concurrent one-sentence requests"
TWICE_SECTION = "serving: one document of 200 sentences sent twice, beam 4, translation cache on"
CACHE_BYTES: int = Settings.model_fields["translation_cache_bytes"].default  # the service's default

Post = Callable[[str, dict[str, Any]], bytes]  # (url, JSON body) → the response's body


def as_document(sentences: Sequence[str], per_paragraph: int = 5) -> str:
    paragraphs = [sentences[i : i + per_paragraph] for i in range(0, len(sentences), per_paragraph)]
    return "\n\n".join(" ".join(p) for p in paragraphs)


def document_rows(results: Results, base_url: str, sentences: Sequence[str], pids: Sequence[int]) -> None:
    n = len(sentences)
    document = as_document(sentences)
    measure = partial(_row, results, f"{base_url}/v1/translate", pids)
    measure(
        f"{n} concurrent one-sentence requests", lambda i: {"text": sentences[i % n], "beam_size": 4}, n, 1, n
    )
    measure("one document", lambda i: {"text": document, "beam_size": 4}, 1, n, 3, baseline=False)


def _row(
    results: Results,
    url: str,
    pids: Sequence[int],
    system: str,
    body: BodyFactory,
    concurrency: int,
    items: int,
    n_requests: int,
    baseline: bool = True,
) -> None:
    res, cpu = metered_load(
        url,
        body,
        pids,
        concurrency=concurrency,
        items_per_request=items,
        n_requests=n_requests,
        timeout_s=600,
    )
    if res.requests == 0:
        results.note(f"{SECTION}: {system}: no successful request ({res.errors}: {res.first_error})")
        return
    results.add(
        Row(SECTION, system, res.items_per_s, "sent/s", baseline=baseline, extra=load_extra(res, cpu))
    )


def cached_document_rows(bench: Bench, sentences: Sequence[str]) -> None:
    """A service of its own with the translation cache on, the document sent to it twice."""
    service = bench.start_service(
        {"TSERVE_TRANSLATION_CACHE_BYTES": str(CACHE_BYTES)}, " (translation cache)"
    )
    if service is None:
        return
    try:
        document_twice_rows(bench.results, service.base, sentences)
    finally:
        service.stop()


def _post(url: str, body: dict[str, Any]) -> bytes:
    response = httpx.post(url, json=body, timeout=600)
    response.raise_for_status()
    return response.content


def document_twice_rows(
    results: Results,
    base_url: str,
    sentences: Sequence[str],
    post: Post = _post,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Sentences/s of the document's first and second request (the first the baseline, so the
    second's ratio is the cache's speed-up), each with its latency; a note if the two answers
    differ, which the cache must never allow."""
    url, body = f"{base_url}/v1/translate", {"text": as_document(sentences), "beam_size": 4}
    answers = []
    systems = ("first time (every sentence decoded)", "second time (every sentence from the cache)")
    for i, system in enumerate(systems):
        start = clock()
        answers.append(post(url, body))
        seconds = clock() - start
        rate = len(sentences) / seconds
        extra = {"latency_ms": seconds * 1000}
        results.add(Row(TWICE_SECTION, system, rate, "sent/s", baseline=i == 0, extra=extra))
    if answers[0] != answers[1]:
        results.note(f"{TWICE_SECTION}: the second answer differs from the first")
