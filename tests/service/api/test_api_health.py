"""Probes, metrics, docs, and the lifecycle: not ready while warming up, draining, failed load."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from service.http.app import create_app
from tests.service.api.conftest import error_of, eventually, metric, serving, small_settings, until_ready
from tests.service.small_engines import HashEmbedder

pytestmark = pytest.mark.anyio


async def test_not_ready_until_warmed_up() -> None:
    async with serving(wait_ready=False, warmup_s=0.3) as s:
        assert (await s.client.get("/health/live")).status_code == 200
        ready = await s.client.get("/health/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "loading"
        assert metric("tserve_ready") == 0
        r = await s.client.post("/v1/embed", json={"texts": ["early"]})
        assert r.status_code == 503 and error_of(r)["type"] == "not_ready"
        assert "Retry-After" in r.headers
        await until_ready(s.client)
        assert s.embedder.hooks.warmed and s.translator.hooks.warmed
        body = (await s.client.get("/health/ready")).json()
        assert body["status"] == "ready"
        assert set(body["models"]) == {s.embedder.manifest.name, s.translator.manifest.name}
        assert metric("tserve_ready") == 1
        assert (await s.client.post("/v1/embed", json={"texts": ["now"]})).status_code == 200


async def test_a_model_that_cannot_start_leaves_the_service_not_ready_and_says_why() -> None:
    class Broken(HashEmbedder):
        def warmup(self) -> None:
            raise RuntimeError("onnxruntime could not allocate")

    async with serving(given={"embed": Broken()}, wait_ready=False) as s:
        await eventually(lambda: s.app.state.runtime.state == "failed")
        r = await s.client.get("/health/ready")
        assert r.status_code == 503
        assert r.json() == {"status": "failed", "detail": "onnxruntime could not allocate"}
        assert (await s.client.get("/health/live")).status_code == 200


async def test_missing_artefacts_without_auto_export_fail_clearly(tmp_path: Path) -> None:
    settings = small_settings(artefact_root=str(tmp_path), auto_export=False, translate_model="")
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        await eventually(lambda: app.state.runtime.state == "failed")
    detail = app.state.runtime.detail
    assert "no " in detail and "all-MiniLM-L6-v2" in detail and "python -m export default" in detail


async def test_draining_refuses_new_work_and_flips_readiness() -> None:
    async with serving() as s:
        s.app.state.runtime.begin_drain()
        assert (await s.client.get("/health/ready")).json()["status"] == "draining"
        assert (await s.client.get("/health/ready")).status_code == 503
        r = await s.client.post("/v1/translate", json={"text": "hi"})
        assert r.status_code == 503 and error_of(r)["type"] == "shutting_down"
        assert (await s.client.get("/health/live")).status_code == 200


async def test_a_model_not_configured_is_404() -> None:
    async with serving(given={"embed": HashEmbedder(name="only-embed")}) as s:
        r = await s.client.post("/v1/translate", json={"text": "hi"})
        assert r.status_code == 404 and error_of(r)["type"] == "model_not_found"


async def test_metrics_label_requests_by_route_template() -> None:
    async with serving() as s:
        before = metric("tserve_requests_total", endpoint="/v1/embed", status="200")
        other = metric("tserve_requests_total", endpoint="other", status="404")
        await s.client.post("/v1/embed", json={"texts": ["count me"]})
        await s.client.get("/no/such/path/42")
        text = (await s.client.get("/metrics")).text
        assert "tserve_requests_total" in text and "tserve_batch_size" in text
        assert metric("tserve_requests_total", endpoint="/v1/embed", status="200") - before == 1
        assert metric("tserve_requests_total", endpoint="other", status="404") - other == 1
        name = s.embedder.manifest.name
        assert (
            metric(
                "tserve_model_info", model=name, task="embed", variant="fp32", provider="CPUExecutionProvider"
            )
            == 1
        )


async def test_inflight_requests_count_the_requests_being_served() -> None:
    gate = threading.Event()
    async with serving(gate=gate) as s:
        idle = metric("tserve_inflight_requests")
        try:
            held = asyncio.ensure_future(s.client.post("/v1/embed", json={"texts": ["held"]}))
            await eventually(lambda: len(s.embedder.hooks.batches) == 1)  # in the engine, not answered
            assert metric("tserve_inflight_requests") - idle == 1
        finally:
            gate.set()
        assert (await held).status_code == 200
        assert metric("tserve_inflight_requests") == idle


async def test_openapi_and_docs() -> None:
    async with serving() as s:
        schema = (await s.client.get("/openapi.json")).json()
        assert {"/v1/translate", "/v1/embed", "/v1/embeddings", "/v1/models", "/health/ready"} <= set(
            schema["paths"]
        )
        beam = schema["components"]["schemas"]["TranslateRequest"]["properties"]["beam_size"]
        assert (beam["minimum"], beam["maximum"]) == (1, 8)
        assert (await s.client.get("/docs")).status_code == 200


async def test_request_ids_are_echoed_or_made() -> None:
    async with serving() as s:
        given = await s.client.get("/health/live", headers={"X-Request-ID": "abc-123"})
        assert given.headers["X-Request-ID"] == "abc-123"
        made = await s.client.get("/health/live", headers={"X-Request-ID": "bad id with spaces"})
        assert (
            made.headers["X-Request-ID"] != "bad id with spaces" and len(made.headers["X-Request-ID"]) == 32
        )
