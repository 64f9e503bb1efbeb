"""A translated file is charged against its key's quota on both file routes: one request and
the characters of its text, before anything is queued, in each API's error shape; another key
is served meanwhile."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from service.serving.quotas import QuotaBook
from service.settings import KeyQuota
from tests.service.api.conftest import Served, error_of, serving
from tests.service.files.conftest import file_settings

pytestmark = pytest.mark.anyio

LIMITED, FREE = "key-files-limited-5d1e", "key-files-free-c380"
TEXT = b"Two dogs play in the snow.\n"  # 26 characters of text once its line is read


def quota_settings(quota: KeyQuota) -> Any:
    return file_settings(api_keys=[LIMITED, FREE], api_key_quotas={LIMITED: quota.model_dump()})


def with_quota(served: Served, quota: KeyQuota) -> None:
    """The quota on a clock that never moves: nothing refills during the test."""
    served.app.state.runtime.quotas = QuotaBook({LIMITED: quota}, lambda: 0.0)


async def v1_file(served: Served, key: str, data: bytes = TEXT) -> httpx.Response:
    return await served.client.post(
        "/v1/translate/file",
        files={"file": ("notes.txt", data)},
        data={"target_language": "de"},
        headers={"Authorization": f"Bearer {key}"},
    )


async def libre_file(served: Served, key: str, data: bytes = TEXT) -> httpx.Response:
    form = {"source": "en", "target": "de", "api_key": key}
    return await served.client.post("/translate_file", files={"file": ("notes.txt", data)}, data=form)


@pytest.mark.parametrize("send", [v1_file, libre_file], ids=["v1", "libretranslate"])
async def test_each_file_spends_one_request_of_its_key(send: Any) -> None:
    quota = KeyQuota(requests_per_minute=2)
    async with serving(quota_settings(quota)) as served:
        with_quota(served, quota)
        for _ in range(2):
            assert (await send(served, LIMITED)).status_code == 200
        batches = len(served.translator.hooks.batches)
        refused = await send(served, LIMITED)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "30"
        assert "requests_per_minute" in refused.text and LIMITED not in refused.text
        assert len(served.translator.hooks.batches) == batches  # refused before queueing
        assert (await send(served, FREE)).status_code == 200


async def test_a_files_text_is_charged_by_its_characters_in_each_apis_shape() -> None:
    quota = KeyQuota(characters_per_minute=60)
    async with serving(quota_settings(quota)) as served:
        with_quota(served, quota)
        assert (await v1_file(served, LIMITED)).status_code == 200  # 26 of 60
        assert (await libre_file(served, LIMITED)).status_code == 200  # 52 of 60
        refused = await v1_file(served, LIMITED)
        assert refused.status_code == 429
        error = error_of(refused)
        assert (error["type"], error["limit"]) == ("quota_exceeded", 60)
        assert "characters_per_minute" in error["message"]
        refused = await libre_file(served, LIMITED)
        assert refused.status_code == 429 and set(refused.json()) == {"error"}
        assert "characters_per_minute" in refused.json()["error"]
        assert (await libre_file(served, FREE)).status_code == 200
