"""The metric helpers of the hot path: remembered children, stage timing via Histogram.time()."""

from __future__ import annotations

from prometheus_client import REGISTRY

from service.metrics import INPUT_TOKENS, REQUESTS, labelled, observe_stage, timed


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
