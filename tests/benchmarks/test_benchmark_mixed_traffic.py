"""The mixed-traffic stage pools its rounds per mode."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.mixed_traffic import Mix, Pooled, Round, ms, report
from benchmarks.results import Figure, Results
from benchmarks.targets import FLOORS


def _round(short_ms: list[float], tokens: float, seconds: float) -> Round:
    mixed = Mix([x / 1000 for x in short_ms], [0.5], Counter({200: len(short_ms) + 1}), seconds)
    return Round(mixed, tokens, Mix([0.1], [], Counter({200: 1}), seconds / 2))


def test_rounds_are_pooled_not_averaged() -> None:
    pooled = Pooled()
    pooled.add(_round([100.0] * 99 + [900.0], tokens=1000, seconds=10))
    pooled.add(_round([100.0] * 100, tokens=3000, seconds=20))
    assert len(pooled.mixed.short_latencies_s) == 200 and pooled.mixed.statuses[200] == 202
    assert pooled.tokens / pooled.mixed.seconds == pytest.approx(4000 / 30)  # not the mean of 100 and 150
    assert pooled.uniform.seconds == 15 and sum(pooled.uniform.statuses.values()) == 2
    assert pooled.round_p99_ms[1] == 100.0 and pooled.round_p99_ms[0] > 100.0
    assert ms(pooled.mixed.short_latencies_s, 50) == pytest.approx(100.0)


def test_the_short_p99_without_long_inputs_is_set_against_whole_batch_s_mixed_p99() -> None:
    results = Results()
    for mode, mixed_ms, uniform_ms in (("batch", 200.0, 90.0), ("continuous", 150.0, 80.0)):
        pooled = Pooled()
        one = _round([mixed_ms] * 100, tokens=1000, seconds=10)
        one.uniform = Mix([uniform_ms / 1000] * 100, [], Counter({200: 100}), 5)
        pooled.add(one)
        report(results, mode, pooled)
    floor = next(f for f in FLOORS if f.of.figure is Figure.UNIFORM_CONTINUOUS)
    assert floor.value(results) == pytest.approx(80.0 / 200.0)
