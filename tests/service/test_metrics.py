"""The metric helpers of the hot path: remembered children, stage timing via Histogram.time(),
many observations at once."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from service.metrics import (
    INPUT_TOKENS,
    REQUESTS,
    labelled,
    observe_many,
    observe_stage,
    observe_stages,
    timed,
)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_labelled_is_the_metric_child_made_once() -> None:
    child = labelled(REQUESTS, "/v1/test-labelled", "200")
    assert child is REQUESTS.labels(endpoint="/v1/test-labelled", status="200")
    assert labelled(REQUESTS, "/v1/test-labelled", "200") is child
    assert labelled(REQUESTS, "/v1/test-labelled", "422") is not child
    labelled(INPUT_TOKENS, "test-labelled").inc(3)
    assert sample("tserve_input_tokens_total", model="test-labelled") == 3


def test_stage_timing_lands_in_the_stage_histogram() -> None:
    labels = {"model": "test-timed", "stage": "tokenize"}
    with timed("test-timed", "tokenize"):
        pass
    observe_stage("test-timed", "tokenize", 0.2)
    assert sample("tserve_stage_duration_seconds_count", **labels) == 2
    assert 0.2 <= sample("tserve_stage_duration_seconds_sum", **labels) < 0.3
    assert sample("tserve_stage_duration_seconds_bucket", le="0.001", **labels) == 1


def test_observe_stages_is_an_observation_each() -> None:
    labels = {"model": "test-stages", "stage": "queue"}
    observe_stages("test-stages", "queue", [0.002, 0.002, 0.5, 0.002])
    assert sample("tserve_stage_duration_seconds_count", **labels) == 4
    assert sample("tserve_stage_duration_seconds_bucket", le="0.0025", **labels) == 3
    assert sample("tserve_stage_duration_seconds_sum", **labels) == pytest.approx(0.506)


@pytest.mark.parametrize(
    "amounts",
    [[], [0.5], [0.001, 0.001, 0.0010001, 1.0, 40.0, 40.0, 0.0], [0.3] * 128 + [0.01] * 3 + [2.5, 2.6]],
)
def test_observe_many_leaves_what_one_observe_each_leaves(amounts: list[float]) -> None:
    """Every bucket (bounds included: an amount on a bound is in it), the count and the sum."""
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    buckets = (0.001, 0.01, 0.3, 1.0, 2.5)
    reference = Histogram("h", "h", ["x"], buckets=buckets, registry=one_by_one).labels("a")
    for amount in amounts:
        reference.observe(amount)
    observe_many(Histogram("h", "h", ["x"], buckets=buckets, registry=at_once).labels("a"), amounts)
    expected = {s.name + str(s.labels): s.value for m in one_by_one.collect() for s in m.samples}
    got = {s.name + str(s.labels): s.value for m in at_once.collect() for s in m.samples}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if key.startswith("h_created"):
            continue
        assert got[key] == pytest.approx(value), key
