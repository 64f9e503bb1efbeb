"""The in-process embedding figures: sustained rates over the same window as an HTTP level, each
system in its faster configuration, lanes that each embed their own share at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from benchmarks.embedding import Lanes, in_process, lane_counts

CALL_S = 0.02


class TimedSystem:
    """Ten sentences a call, each call at least ``per_call_s`` long."""

    def __init__(
        self, name: str = "timed", config: str = "1 × 1 threads", per_call_s: float = CALL_S
    ) -> None:
        self.name = name
        self.config = config
        self.per_call_s = per_call_s
        self.calls = 0
        self.call_seconds: list[float] = []  # as long as each call really took (a loaded machine oversleeps)

    def embed(self, sentences: Sequence[str]) -> None:
        self.calls += 1
        start = time.perf_counter()
        time.sleep(self.per_call_s)
        self.call_seconds.append(time.perf_counter() - start)


def test_a_run_passes_over_the_sentences_until_its_window_is_over() -> None:
    system = TimedSystem()
    best = in_process([system], ["a sentence"] * 10, rounds=2, min_seconds=0.2)
    rate = best["timed"].sentences_per_s
    # after the warm-up, calls for (about: the loop itself takes a little) 0.2 s a round at least
    assert sum(system.call_seconds[1:]) >= 2 * 0.2 * 0.9
    assert rate <= 10 / CALL_S  # a sustained rate: no call was counted twice or left out of the time
    assert in_process([TimedSystem()], ["x"], rounds=0, min_seconds=1.0) == {}


def test_a_system_keeps_the_run_of_its_faster_configuration() -> None:
    slow = TimedSystem("ours", "1 × 2 threads", per_call_s=0.02)
    fast = TimedSystem("ours", "2 lanes × 1 thread", per_call_s=0.005)
    other = TimedSystem("theirs", "1 × 2 threads", per_call_s=0.01)
    best = in_process([slow, fast, other], ["a sentence"] * 10, rounds=1, min_seconds=0.1)
    assert set(best) == {"ours", "theirs"}
    assert best["ours"].config == "2 lanes × 1 thread"
    assert best["ours"].sentences_per_s > 10 / 0.02
    assert best["theirs"].config == "1 × 2 threads"


def test_lanes_embed_their_shares_at_once_on_threads_of_their_own() -> None:
    lanes = Lanes(3, 3)
    barrier = threading.Barrier(3, timeout=5)  # passes only if all three shares run together
    seen: list[tuple[str, int]] = []

    def work(share: list[str]) -> None:
        barrier.wait()
        seen.extend((s, threading.get_ident()) for s in share)

    lanes.run(work, [["a", "d"], ["b"], ["c"]])
    assert sorted(s for s, _ in seen) == ["a", "b", "c", "d"]
    assert len({t for _, t in seen}) == 3
    assert dict(seen)["a"] == threading.get_ident()  # the first share on the caller's thread


def test_every_system_runs_on_all_threads_at_once_and_as_one_lane_per_thread() -> None:
    assert lane_counts(2) == [1, 2]
    assert lane_counts(1) == [1]
