"""The playground's server side: the page and its files at / (open without a key, off by a
setting) and the Server-Timing header of the model routes."""

from __future__ import annotations

import re

import pytest

from service.api.playground import PLAYGROUND_DIR
from tests.service.api.conftest import Served, serving, small_settings

pytestmark = pytest.mark.anyio

_METRIC = re.compile(r'^(?P<name>[a-z]+);dur=(?P<dur>\d+\.\d{2});desc="(?P<desc>[^"]*)"$')


def server_timing(header: str) -> dict[str, float]:
    """``name`` → milliseconds, checking every metric's syntax (W3C Server Timing)."""
    stages: dict[str, float] = {}
    for metric in header.split(", "):
        match = _METRIC.match(metric)
        assert match, f"malformed Server-Timing metric {metric!r}"
        stages[match["name"]] = float(match["dur"])
    return stages


async def test_page_and_assets_are_served_with_a_strict_policy(served: Served) -> None:
    page = await served.client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    referenced = re.findall(r'(?:src|href)="(/playground/[^"]+)"', page.text)
    assert {"/playground/playground.js", "/playground/playground.css"} <= set(referenced)
    for path in referenced:
        asset = await served.client.get(path)
        assert asset.status_code == 200, path
        assert asset.content == (PLAYGROUND_DIR / path.removeprefix("/playground/")).read_bytes()
    assert (
        (await served.client.get("/playground/playground.js"))
        .headers["content-type"]
        .startswith("text/javascript")
    )
    assert (await served.client.get("/playground/missing.js")).status_code == 404
    assert (await served.client.get("/playground/../settings.py")).status_code == 404


async def test_the_page_is_open_while_the_api_needs_a_key() -> None:
    async with serving(small_settings(api_keys=["secret"])) as s:
        assert (await s.client.get("/")).status_code == 200
        assert (await s.client.get("/playground/playground.js")).status_code == 200
        assert (await s.client.get("/v1/models")).status_code == 401
        authorised = await s.client.get("/v1/models", headers={"Authorization": "Bearer secret"})
        assert authorised.status_code == 200


async def test_the_setting_turns_the_playground_off() -> None:
    async with serving(small_settings(playground=False)) as s:
        assert (await s.client.get("/")).status_code == 405  # only TEI's POST / is left there
        assert (await s.client.get("/playground/playground.js")).status_code == 404
        assert (await s.client.post("/v1/embed", json={"texts": ["still served"]})).status_code == 200


async def test_translate_reports_its_own_stages(served: Served) -> None:
    response = await served.client.post(
        "/v1/translate", json={"text": "A man rides. Two dogs play.", "alignments": True}
    )
    assert response.status_code == 200
    stages = server_timing(response.headers["server-timing"])
    assert list(stages) == ["body", "segment", "translate", "total"]
    assert stages["segment"] + stages["translate"] <= stages["total"]


async def test_a_slow_batch_shows_in_its_stage() -> None:
    async with serving(delay_s=0.2) as s:
        response = await s.client.post("/v1/embed", json={"texts": ["one", "two"]})
        stages = server_timing(response.headers["server-timing"])
        assert list(stages) == ["body", "embed", "total"]
        assert stages["embed"] >= 200
        assert stages["total"] >= stages["embed"]


async def test_errors_carry_the_stages_they_reached(served: Served) -> None:
    refused = await served.client.post("/v1/translate", json={"text": " "})
    assert refused.status_code == 422
    assert list(server_timing(refused.headers["server-timing"])) == ["body", "total"]
    unknown = await served.client.get("/v1/nothing-here")
    assert unknown.status_code == 404
    assert list(server_timing(unknown.headers["server-timing"])) == ["total"]


async def test_only_the_model_routes_carry_it(served: Served) -> None:
    libre = await served.client.post(
        "/translate", json={"q": "Two dogs play.", "source": "en", "target": "de"}
    )
    assert libre.status_code == 200
    assert "translate" in server_timing(libre.headers["server-timing"])
    for path in ("/health/live", "/health/ready", "/metrics", "/"):
        assert "server-timing" not in (await served.client.get(path)).headers, path
