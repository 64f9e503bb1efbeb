"""Stage ``detection``: what language identification costs per short text.

In-process, the service's detector (``service/serving/detection.py``, among English and German
as the small model's service has them) over Multi30k validation captions in both languages,
whole and cut to their first three words: microseconds per text (the best of ``--rounds``
passes), and the share detected as the language the text is in. Over HTTP, ``POST /detect``
with one caption per request from 1, 16 and 64 clients: requests/s. The detector is a pure
function of the text; the HTTP rows add the route's parsing, limits and the worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks.common import read_lines
from benchmarks.harness import Bench, Need, Stage
from benchmarks.loadgen import BodyFactory
from benchmarks.results import Results, Row

CANDIDATES = ("en", "de")  # the languages the small en→de model's service detects among
IN_PROCESS_SECTION = "detection: in-process, one short text at a time (Multi30k val, English and German)"
HTTP_SECTION = "serving: POST /detect, one short text per request"
HTTP_CLIENTS = (1, 16, 64)
SNIPPET_WORDS = 3


@dataclass(frozen=True)
class Labelled:
    """A text and the language it is written in."""

    text: str
    language: str


def short_texts(captions: dict[str, Sequence[str]], words: int | None = None) -> list[Labelled]:
    """Each language's captions (``language`` → captions) interleaved, whole or cut to their first
    ``words`` words."""
    cut = (lambda text: " ".join(text.split()[:words])) if words else (lambda text: text)
    per_language = [[Labelled(cut(t), lang) for t in texts] for lang, texts in captions.items()]
    return [one for group in zip(*per_language, strict=False) for one in group]


def detection_row(
    results: Results,
    texts: Sequence[Labelled],
    system: str,
    rounds: int,
    baseline: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> Row:
    """One row of microseconds per text: the best of ``rounds`` passes over ``texts`` through
    the service's detector, with the share detected correctly."""
    from service.serving.detection import LanguageDetector

    detector = LanguageDetector(CANDIDATES)
    found = [detector.detect(t.text).language for t in texts]  # loads the model, untimed
    best = float("inf")
    for _ in range(rounds):
        start = clock()
        for t in texts:
            detector.detect(t.text)
        best = min(best, clock() - start)
    correct = sum(language == t.language for language, t in zip(found, texts, strict=True))
    extra = {"texts": len(texts), "correct_pct": round(100 * correct / len(texts), 2)}
    return results.add(
        Row(
            IN_PROCESS_SECTION,
            system,
            best / len(texts) * 1e6,
            "µs/text",
            baseline=baseline,
            higher_is_better=False,
            extra=extra,
        )
    )


def detect_body(texts: Sequence[Labelled]) -> BodyFactory:
    """Request ``i``'s body: the ``i``-th text, in turn."""
    return lambda i: {"q": texts[i % len(texts)].text}


def validation_captions(bench: Bench, n: int) -> dict[str, Sequence[str]]:
    return {lang: read_lines(bench.multi30k / f"val.{lang}.gz")[:n] for lang in CANDIDATES}


def run(bench: Bench) -> None:
    print("== language detection", flush=True)
    captions = validation_captions(bench, 200 if bench.quick else 1000)
    sentences = short_texts(captions)
    detection_row(bench.results, sentences, "whole captions", bench.rounds, baseline=True)
    detection_row(
        bench.results, short_texts(captions, SNIPPET_WORDS), f"first {SNIPPET_WORDS} words", bench.rounds
    )
    if bench.service is None:
        return
    from benchmarks.serving import load_row

    for clients in HTTP_CLIENTS:
        load_row(
            bench.results,
            HTTP_SECTION,
            f"{clients} client{'s' if clients > 1 else ''}",
            f"{bench.service.base}/detect",
            detect_body(sentences),
            [bench.service.pid],
            clients=clients,
            items=1,
            duration_s=bench.duration,
            rounds=bench.rounds,
            baseline=clients == HTTP_CLIENTS[0],
        )


STAGE = Stage("detection", "language detection", frozenset({Need.OUR_CHECKPOINT, Need.SERVICE}), run)
