"""Per-key quotas on a clock of the test's own: each limit a token bucket, refused requests
spend nothing, ``Retry-After`` is when the request would pass, and the settings that give them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.serving.failures import InvalidRequest, failure_of
from service.serving.quotas import QuotaBook, QuotaExceeded
from service.settings import KeyQuota
from tests.service.api.conftest import metric, small_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def book(clock: Clock, **limits: int) -> QuotaBook:
    return QuotaBook({"key-a": KeyQuota(**limits), "key-b": KeyQuota(requests_per_minute=1)}, clock)


def refusal(quotas: QuotaBook, key: str, characters: int = 1) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as refused:
        quotas.charge(key, characters, "text")
    return refused.value


def test_requests_per_minute_refill_one_by_one_and_retry_after_says_when() -> None:
    clock = Clock()
    quotas = book(clock, requests_per_minute=2)
    before = metric("tserve_quota_rejections_total", limit="requests_per_minute")
    quotas.charge("key-a", 1, "text")
    quotas.charge("key-a", 1, "text")
    refused = refusal(quotas, "key-a")
    assert failure_of(refused).status == 429 and refused.type == "quota_exceeded"
    assert refused.headers == {"Retry-After": "30"} and refused.limit == 2  # one request every 30 s
    assert "requests_per_minute" in refused.message and "key-a" not in refused.message
    clock.now += 29.5
    assert refusal(quotas, "key-a").headers == {"Retry-After": "1"}  # rounded up, never 0
    clock.now += 0.5
    quotas.charge("key-a", 1, "text")
    assert metric("tserve_quota_rejections_total", limit="requests_per_minute") - before == 2


def test_another_key_is_served_while_one_is_over_its_quota() -> None:
    clock = Clock()
    quotas = book(clock, requests_per_minute=1)
    quotas.charge("key-a", 1, "text")
    refusal(quotas, "key-a")
    quotas.charge("key-b", 1, "text")  # its own bucket
    quotas.charge("key-c", 10**9, "text")  # no quota: never limited
    quotas.charge(None, 10**9, "text")  # no key (keys not configured)


def test_characters_per_minute_retry_after_is_the_refill_of_the_missing_characters() -> None:
    clock = Clock()
    quotas = book(clock, characters_per_minute=600)  # 10 characters a second
    quotas.charge("key-a", 550, "text")
    assert refusal(quotas, "key-a", 100).headers == {"Retry-After": "5"}  # 50 missing
    quotas.charge("key-a", 50, "text")
    clock.now += 12
    assert refusal(quotas, "key-a", 121).headers == {"Retry-After": "1"}
    quotas.charge("key-a", 120, "text")


def test_the_day_limit_holds_when_the_minute_limit_has_refilled() -> None:
    clock = Clock()
    quotas = book(clock, characters_per_minute=50_000, characters_per_day=86_400)  # a character a second
    quotas.charge("key-a", 50_000, "text")
    clock.now += 60
    quotas.charge("key-a", 36_460, "text")  # what is left of the day: 36,400 + 60 refilled
    clock.now += 60  # the minute's bucket is full again; the day's holds the 60 s it refilled
    refused = refusal(quotas, "key-a", 100)
    assert refused.limit == 86_400 and "characters_per_day" in refused.message
    assert refused.headers == {"Retry-After": "40"}
    clock.now += 39
    refusal(quotas, "key-a", 100)
    clock.now += 1
    quotas.charge("key-a", 100, "text")


def test_a_refused_request_spends_nothing_of_any_limit() -> None:
    clock = Clock()
    quotas = book(clock, requests_per_minute=3, characters_per_minute=100)
    quotas.charge("key-a", 90, "text")
    for _ in range(5):
        refusal(quotas, "key-a", 20)  # short of characters: its request is not taken either
    quotas.charge("key-a", 10, "text")
    quotas.charge("key-a", 0, "text")  # the third request of the minute


def test_a_request_larger_than_a_whole_bucket_is_422_as_waiting_would_not_help() -> None:
    quotas = book(Clock(), characters_per_minute=100, characters_per_day=1000)
    with pytest.raises(InvalidRequest) as refused:
        quotas.charge("key-a", 101, "q")
    (found,) = refused.value.problems
    assert (found["type"], found["loc"], found["ctx"]) == ("quota_too_small", ("body", "q"), {"limit": 100})
    quotas.charge("key-a", 100, "q")  # nothing was taken by the refusal


def test_usage_is_observed_per_limit_never_per_key() -> None:
    quotas = book(Clock(), characters_per_day=1000)
    before = metric("tserve_quota_usage_ratio_count", limit="characters_per_day")
    quotas.charge("key-a", 500, "text")
    assert metric("tserve_quota_usage_ratio_count", limit="characters_per_day") - before == 1
    assert metric("tserve_quota_usage_ratio_bucket", limit="characters_per_day", le="0.5") >= 1


QUOTAS = {"key-a": {"requests_per_minute": 60, "characters_per_minute": 10000, "characters_per_day": 1000000}}


def test_quotas_come_as_json_or_as_a_json_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSERVE_API_KEYS", "key-a,key-b")
    monkeypatch.setenv("TSERVE_API_KEY_QUOTAS", json.dumps(QUOTAS))
    from service.settings import Settings

    expected = {"key-a": KeyQuota(**QUOTAS["key-a"])}
    assert Settings().api_key_quotas == expected
    (tmp_path / "quotas.json").write_text(json.dumps(QUOTAS))
    monkeypatch.setenv("TSERVE_API_KEY_QUOTAS", str(tmp_path / "quotas.json"))
    assert Settings().api_key_quotas == expected
    monkeypatch.setenv("TSERVE_API_KEY_QUOTAS", "")
    assert Settings().api_key_quotas == {}


@pytest.mark.parametrize(
    ("quotas", "complaint"),
    [
        ({"key-z": {"requests_per_minute": 1}}, "not among api_keys"),
        ({"key-a": {"requests_per_hour": 1}}, "requests_per_hour"),
        ({"key-a": {"characters_per_day": 0}}, "characters_per_day"),
    ],
)
def test_quotas_on_unknown_keys_or_limits_stop_the_start(quotas: object, complaint: str) -> None:
    with pytest.raises(ValidationError) as refused:
        small_settings(api_keys=["key-a"], api_key_quotas=quotas)
    assert complaint in str(refused.value) and "key-z" not in str(refused.value)
