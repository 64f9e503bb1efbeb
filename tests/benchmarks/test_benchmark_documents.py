"""The documents rows: the document's layout, and the document sent twice to a service with the
translation cache (its first time the baseline, the second's ratio the speed-up; a note when
the two answers differ)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import documents
from benchmarks.documents import TWICE_SECTION, as_document, cached_document_rows, document_twice_rows
from benchmarks.results import Results


def test_a_document_is_paragraphs_of_five_sentences() -> None:
    sentences = [f"Sentence {i}." for i in range(12)]
    paragraphs = as_document(sentences).split("\n\n")
    assert [len(p.split(". ")) for p in paragraphs] == [5, 5, 2]


class Replies:
    """A service's answers, each taking the time a clock of the test's own says."""

    def __init__(self, answers: list[bytes], seconds: list[float]) -> None:
        self.answers, self.seconds, self.now = answers, seconds, 0.0
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def post(self, url: str, body: dict[str, Any]) -> bytes:
        self.sent.append((url, body))
        self.now += self.seconds[len(self.sent) - 1]
        return self.answers[len(self.sent) - 1]

    def clock(self) -> float:
        return self.now


def test_the_second_time_is_set_against_the_first() -> None:
    sentences = [f"Sentence {i}." for i in range(200)]
    replies = Replies([b"same", b"same"], [4.0, 0.1])
    results = Results()
    document_twice_rows(results, "http://x", sentences, replies.post, replies.clock)
    first, second = results.rows
    assert (first.section, second.section) == (TWICE_SECTION, TWICE_SECTION)
    assert first.baseline and not second.baseline
    assert (first.value, second.value) == (50.0, pytest.approx(2000.0))
    assert second.ratio == pytest.approx(40.0) and second.extra["latency_ms"] == pytest.approx(100.0)
    assert replies.sent == [("http://x/v1/translate", {"text": as_document(sentences), "beam_size": 4})] * 2
    assert results.notes == []


def test_a_second_answer_that_differs_is_noted() -> None:
    replies = Replies([b"one", b"two"], [1.0, 1.0])
    results = Results()
    document_twice_rows(results, "http://x", ["A.", "B."], replies.post, replies.clock)
    assert results.notes == [f"{TWICE_SECTION}: the second answer differs from the first"]


def test_its_service_is_started_with_the_cache() -> None:
    started: list[dict[str, str]] = []

    class Bench:
        results = Results()

        def start_service(self, extra_env: dict[str, str], tag: str) -> None:
            started.append(extra_env)  # and fails to start: nothing is measured

    cached_document_rows(Bench(), ["A."])  # type: ignore[arg-type]
    assert started == [{"TSERVE_TRANSLATION_CACHE_BYTES": str(documents.CACHE_BYTES)}]
    assert Bench.results.rows == []
