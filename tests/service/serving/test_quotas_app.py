"""Per-key quotas over the real app (small engines): a key over its quota gets 429 with
``Retry-After`` in each API's error shape, before anything is queued, while another key is
served; the metrics name the limit, never the key."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, generate_latest

from service.serving.quotas import QuotaBook
from service.settings import KeyQuota
from tests.service.api.conftest import Served, error_of, metric, serving, small_settings

pytestmark = pytest.mark.anyio

LIMITED, FREE = "key-limited-7f3a", "key-free-91c2"
QUOTAS = {LIMITED: KeyQuota(requests_per_minute=2, characters_per_day=100)}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def v1(served: Served, key: str, text: str = "a b") -> httpx.Response:
    return await served.client.post("/v1/translate", json={"text": text}, headers=bearer(key))


async def libre(served: Served, key: str, q: str = "a b") -> httpx.Response:
    body: dict[str, Any] = {"q": q, "source": "en", "target": "de", "api_key": key}
    return await served.client.post("/translate", json=body)


def quota_settings() -> Any:
    return small_settings(
        api_keys=[LIMITED, FREE], api_key_quotas={k: q.model_dump() for k, q in QUOTAS.items()}
    )


def with_clock(served: Served) -> Clock:
    clock = Clock()
    served.app.state.runtime.quotas = QuotaBook(QUOTAS, clock)
    return clock


async def test_a_key_over_its_quota_gets_429_with_retry_after_while_another_is_served() -> None:
    async with serving(quota_settings()) as served:
        clock = with_clock(served)
        assert (await v1(served, LIMITED)).status_code == 200
        assert (await libre(served, LIMITED)).status_code == 200  # both APIs spend one bucket
        batches = len(served.translator.hooks.batches)
        refused = await v1(served, LIMITED, "c d")
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "30"
        error = error_of(refused)
        assert (error["type"], error["limit"]) == ("quota_exceeded", 2)
        assert "requests_per_minute" in error["message"] and LIMITED not in refused.text
        assert len(served.translator.hooks.batches) == batches  # refused before queueing
        for _ in range(3):
            assert (await v1(served, FREE, "e f")).status_code == 200
            assert (await libre(served, FREE, "g h")).status_code == 200
        clock.now += 30
        assert (await v1(served, LIMITED, "c d")).status_code == 200


async def test_libretranslate_answers_the_refusal_in_its_own_shape() -> None:
    async with serving(quota_settings()) as served:
        with_clock(served)
        for _ in range(2):
            assert (await libre(served, LIMITED)).status_code == 200
        refused = await libre(served, LIMITED)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "30"
        assert set(refused.json()) == {"error"} and "requests_per_minute" in refused.json()["error"]
        # the key may come as a bearer token too: the same key, the same bucket
        as_bearer = await served.client.post(
            "/translate", json={"q": "a b", "source": "en", "target": "de"}, headers=bearer(LIMITED)
        )
        assert as_bearer.status_code == 429


async def test_the_day_limit_and_a_request_larger_than_it() -> None:
    async with serving(quota_settings()) as served:
        with_clock(served)
        assert (await v1(served, LIMITED, "x" * 90)).status_code == 200
        refused = await v1(served, LIMITED, "y" * 20)  # a request left this minute, 10 characters today
        assert refused.status_code == 429 and error_of(refused)["limit"] == 100
        assert "characters_per_day" in error_of(refused)["message"]
        assert refused.headers["Retry-After"] == "8640"  # 100 characters a day: 10 refill in 8640 s
        too_large = await libre(served, LIMITED, "z" * 101)
        assert too_large.status_code == 400 and "characters_per_day" in too_large.json()["error"]
        too_large = await v1(served, LIMITED, "z" * 101)
        assert too_large.status_code == 422 and error_of(too_large)["type"] == "validation_error"


async def test_the_metrics_count_refusals_by_limit_and_never_name_a_key() -> None:
    before = metric("tserve_quota_rejections_total", limit="requests_per_minute")
    async with serving(quota_settings()) as served:
        with_clock(served)
        for _ in range(4):
            await v1(served, LIMITED)
        exposition = (await served.client.get("/metrics")).text
    assert metric("tserve_quota_rejections_total", limit="requests_per_minute") - before == 2
    assert LIMITED not in exposition and FREE not in exposition
    assert LIMITED not in generate_latest(REGISTRY).decode()
