"""Stage ``detection``: its texts (captions in both languages, in turn, whole or cut), its
in-process rows through the service's own detector (the best pass, microseconds per text, the
share detected right), and its HTTP rows: one text per request to ``/detect`` at each client
count, the first the baseline."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks import common, detection
from benchmarks.detection import HTTP_CLIENTS, HTTP_SECTION, IN_PROCESS_SECTION, Labelled, short_texts
from benchmarks.loadgen import LoadResult
from benchmarks.results import Results

CAPTIONS = {
    "en": ["A man in a blue shirt is riding a bicycle down the street.", "Two dogs play in the snow."],
    "de": [
        "Ein Mann in einem blauen Hemd fährt mit dem Fahrrad die Straße entlang.",
        "Zwei Hunde spielen im Schnee.",
    ],
}


def test_the_languages_take_turns_whole_or_cut_to_their_first_words() -> None:
    assert short_texts(CAPTIONS, 3)[:2] == [Labelled("A man in", "en"), Labelled("Ein Mann in", "de")]
    assert [t.language for t in short_texts(CAPTIONS)] == ["en", "de", "en", "de"]
    assert short_texts(CAPTIONS)[3].text == CAPTIONS["de"][1]


class Clock:
    """Each reading a millisecond after the last: every pass takes 1 ms."""

    now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def test_a_row_is_microseconds_per_text_with_the_share_detected_right() -> None:
    results = Results()
    row = detection.detection_row(results, short_texts(CAPTIONS), "whole", 2, baseline=True, clock=Clock())
    assert (row.section, row.unit, row.higher_is_better) == (IN_PROCESS_SECTION, "µs/text", False)
    assert row.value == pytest.approx(250.0)  # 1 ms over 4 texts
    assert row.extra == {"texts": 4, "correct_pct": 100.0}
    wrong = [Labelled(CAPTIONS["en"][0], "de")]
    assert detection.detection_row(results, wrong, "mislabelled", 1).extra["correct_pct"] == 0.0


class Bench:
    """What the stage reads of the harness: validation captions in a folder of the test's own."""

    def __init__(self, multi30k: Path, service: Any = None) -> None:
        self.multi30k, self.service = multi30k, service
        self.quick, self.rounds, self.duration = True, 1, 0.5
        self.results = Results()


def write_captions(folder: Path) -> Path:
    for lang, texts in CAPTIONS.items():
        with gzip.open(folder / f"val.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(texts) + "\n")
    return folder


def test_without_a_service_only_the_in_process_rows_are_measured(tmp_path: Path) -> None:
    bench = Bench(write_captions(tmp_path))
    detection.run(bench)  # type: ignore[arg-type]
    whole, snippets = bench.results.rows
    assert (whole.system, whole.baseline, whole.extra["texts"]) == ("whole captions", True, 4)
    assert (snippets.system, snippets.baseline, snippets.extra["texts"]) == ("first 3 words", False, 4)
    assert whole.extra["correct_pct"] == 100.0


def test_over_http_each_client_count_sends_one_text_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, int, list[dict[str, Any]]]] = []

    def run_load(url: str, body: Any, **kwargs: Any) -> LoadResult:
        sent.append((url, kwargs["concurrency"], [body(i) for i in range(5)]))
        return LoadResult(kwargs["concurrency"], 1, 100 * kwargs["concurrency"], 0, 1.0, [0.01] * 100)

    monkeypatch.setattr(common, "run_load", run_load)

    class Service:
        base, pid = "http://x", os.getpid()

    bench = Bench(write_captions(tmp_path), Service())
    detection.run(bench)  # type: ignore[arg-type]
    http = [r for r in bench.results.rows if r.section == HTTP_SECTION]
    assert [r.system for r in http] == ["1 client", "16 clients", "64 clients"]
    assert [r.baseline for r in http] == [True, False, False] and http[2].ratio == pytest.approx(64.0)
    assert [(url, clients) for url, clients, _ in sent] == [("http://x/detect", c) for c in HTTP_CLIENTS]
    texts = [t.text for t in short_texts(CAPTIONS)]
    assert sent[0][2] == [{"q": texts[i % 4]} for i in range(5)]
