"""The in-process embedding figures are sustained rates over the same window as an HTTP level."""

from __future__ import annotations

import time
from collections.abc import Sequence

from benchmarks.embedding import in_process

CALL_S = 0.02


class TimedSystem:
    """Ten sentences a call, each call at least ``CALL_S`` long."""

    name = "timed"

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, sentences: Sequence[str]) -> None:
        self.calls += 1
        time.sleep(CALL_S)


def test_a_run_passes_over_the_sentences_until_its_window_is_over() -> None:
    system = TimedSystem()
    best = in_process([system], ["a sentence"] * 10, rounds=2, min_seconds=0.2)
    rate, _ = best["timed"]
    assert system.calls >= 1 + 2 * 10  # the warm-up, then at least 0.2 s of 0.02-s calls per round
    assert rate <= 10 / CALL_S  # a sustained rate: no call was counted twice or left out of the time
    assert in_process([TimedSystem()], ["x"], rounds=0, min_seconds=1.0) == {}
