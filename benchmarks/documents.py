"""A document as one request against its sentences as as many concurrent one-sentence requests.

The same 200 test-set sentences go to ``POST /v1/translate`` twice: once as one document
(paragraphs of five sentences separated by blank lines), once as 200 one-sentence requests all
in flight together. Both are sentences in the same dynamic batcher; the document saves the
per-request HTTP, validation and JSON cost. Sentences/s of each, and the document's latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from benchmarks.common import load_extra, metered_load
from benchmarks.loadgen import BodyFactory
from benchmarks.results import Results, Row

SECTION = "serving: translate 200 sentences, beam 4: one document vs 200 concurrent one-sentence requests"


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
