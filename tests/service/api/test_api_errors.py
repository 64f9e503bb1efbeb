"""The error contract under load and failure: 413, 408, 415/400 for encodings, 422 for huge numbers,
429, 504, 500, 401/403, CORS."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from service.api.error_responses import BodyTimeout
from service.api.extensions import BODY_RECEIVED_EXTENSION
from service.engine.base import Engine
from service.http.middleware import BodyLimitMiddleware
from tests.service.api.conftest import engines, error_of, eventually, metric, serving, small_settings

pytestmark = pytest.mark.anyio


async def test_a_body_over_the_limit_is_413_from_content_length() -> None:
    async with serving(small_settings(max_body_bytes=1024)) as s:
        r = await s.client.post("/v1/embed", json={"texts": ["w " * 600]})
        assert r.status_code == 413
        error = error_of(r)
        assert error["type"] == "body_too_large" and error["limit"] == 1024
        assert metric("tserve_requests_total", endpoint="other", status="413") >= 1


async def test_a_streamed_body_over_the_limit_is_413() -> None:
    async def chunks():  # no Content-Length: the limit applies while the body arrives
        yield b'{"texts": ["'
        for _ in range(20):
            yield b"w" * 100
        yield b'"]}'

    async with serving(small_settings(max_body_bytes=1024)) as s:
        r = await s.client.post("/v1/embed", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert error_of(r)["limit"] == 1024
        assert r.headers["Connection"] == "close"  # the rest of the body is never read
        assert s.embedder.hooks.batches == []


async def test_a_body_that_stalls_is_408_and_closes() -> None:
    async def stalled():
        yield b'{"texts": ["a'
        await asyncio.sleep(5)
        yield b'"]}'

    async with serving(small_settings(body_timeout_s=0.3)) as s:
        r = await s.client.post("/v1/embed", content=stalled(), headers={"Content-Type": "application/json"})
        assert r.status_code == 408 and r.headers["Connection"] == "close"
        error = error_of(r)
        assert error["type"] == "body_timeout" and error["limit"] == 0.3
        assert metric("tserve_requests_total", endpoint="/v1/embed", status="408") >= 1
        assert s.embedder.hooks.batches == []


@pytest.mark.parametrize("arrived", [True, False], ids=["the server holds the body", "no signal"])
async def test_a_body_the_server_holds_is_read_without_the_deadline(arrived: bool) -> None:
    """With a deadline already past, only the server's word that the body is in lets it through."""
    read: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        read.append((await receive())["body"])

    async def receive() -> Message:
        await asyncio.sleep(0)  # a receive that yields once, as a real one may
        return {"type": "http.request", "body": b"{}", "more_body": False}

    future = asyncio.get_running_loop().create_future()
    future.set_result(None)
    scope = {
        "type": "http",
        "headers": [],
        "extensions": {BODY_RECEIVED_EXTENSION: future} if arrived else {},
    }
    limited = BodyLimitMiddleware(app, max_bytes=1024, timeout_s=0)
    if arrived:
        await limited(scope, receive, lambda message: asyncio.sleep(0))
        assert read == [b"{}"]
    else:
        with pytest.raises(BodyTimeout):
            await limited(scope, receive, lambda message: asyncio.sleep(0))


UTF16_BODY = '{"texts": ["a"]}'.encode("utf-16")


@pytest.mark.parametrize(
    "content, headers, status, type_, limit",
    [
        (b'{"texts": ["a"]}', {"Content-Encoding": "gzip"}, 415, "unsupported_media_type", "identity"),
        (b'{"texts": ["a"]}', {"Content-Encoding": "br, gzip"}, 415, "unsupported_media_type", "identity"),
        (
            b'{"texts": ["caf\xe9"]}',
            {"Content-Type": "application/json; charset=latin-1"},
            400,
            "bad_request",
            "utf-8",
        ),
        (UTF16_BODY, {}, 400, "bad_request", "utf-8"),
        ('{"texts": ["a"]}'.encode("utf-16-be"), {}, 400, "bad_request", "utf-8"),
        ('{"texts": ["a"]}'.encode("utf-32"), {}, 400, "bad_request", "utf-8"),
        (b'{"texts": ["a"], "normalize": ' + b"9" * 5000 + b"}", {}, 422, "validation_error", 4300),
    ],
    ids=["gzip", "br-gzip", "latin-1", "utf-16-bom", "utf-16-be", "utf-32", "5000-digit-integer"],
)
async def test_body_encodings_and_numbers_the_service_does_not_take(
    content: bytes, headers: dict[str, str], status: int, type_: str, limit: object
) -> None:
    async with serving(small_settings(max_body_bytes=16384)) as s:
        r = await s.client.post(
            "/v1/embed", content=content, headers={"Content-Type": "application/json", **headers}
        )
        assert r.status_code == status, r.text
        error = error_of(r)
        assert error["type"] == type_ and error["limit"] == limit
        assert s.embedder.hooks.batches == []


async def test_utf8_bodies_with_or_without_a_declared_charset_are_taken() -> None:
    async with serving() as s:
        for content_type in ("application/json; charset=utf-8", 'application/json; charset="UTF-8"'):
            r = await s.client.post(
                "/v1/embed", content='{"texts": ["café"]}'.encode(), headers={"Content-Type": content_type}
            )
            assert r.status_code == 200, r.text
        identity = {"Content-Type": "application/json", "Content-Encoding": "identity"}
        assert (
            await s.client.post("/v1/embed", content=b'{"texts": ["a"]}', headers=identity)
        ).status_code == 200


async def test_a_full_queue_is_429_with_retry_after() -> None:
    gate = threading.Event()
    embedder, translator = engines(gate=gate)
    translator.hooks.gate = None  # only the embedding worker is held
    given: dict[str, Engine] = {"embed": embedder, "translate": translator}
    async with serving(small_settings(max_queue=8, max_items_per_request=8), given) as s:
        try:
            first = asyncio.ensure_future(s.client.post("/v1/embed", json={"texts": ["busy"]}))
            await eventually(lambda: len(s.embedder.hooks.batches) == 1)  # the worker is held
            queued = asyncio.ensure_future(s.client.post("/v1/embed", json={"texts": ["q"] * 8}))
            await eventually(lambda: s.app.state.runtime.embedding_model.queue.queued == 8)
            r = await s.client.post("/v1/embed", json={"texts": ["no room"]})
            assert r.status_code == 429
            assert int(r.headers["Retry-After"]) >= 1
            error = error_of(r)
            assert error["type"] == "queue_full" and error["limit"] == 8
            # The translation queue is separate and still serves.
            assert (await s.client.post("/v1/translate", json={"text": "still here"})).status_code == 200
        finally:
            gate.set()
        assert (await first).status_code == 200 and (await queued).status_code == 200


async def test_a_request_past_its_deadline_is_504_and_its_items_dropped() -> None:
    gate = threading.Event()
    async with serving(small_settings(request_timeout_s=0.2), gate=gate) as s:
        name = s.embedder.manifest.name
        try:
            first = asyncio.ensure_future(s.client.post("/v1/embed", json={"texts": ["busy"]}))
            await eventually(lambda: len(s.embedder.hooks.batches) == 1)
            r = await s.client.post("/v1/embed", json={"texts": ["late", "later"]})
            assert r.status_code == 504
            error = error_of(r)
            assert error["type"] == "deadline_exceeded" and error["limit"] == 0.2 and error["request_id"]
            assert metric("tserve_dropped_total", model=name, reason="deadline") == 2
        finally:
            gate.set()
        assert (await first).status_code == 504  # it ran, but past its deadline too
        assert s.embedder.hooks.batches == [["busy"]]


async def test_an_engine_crash_is_500_for_that_batch_and_the_service_keeps_serving() -> None:
    async with serving() as s:
        r = await s.client.post("/v1/embed", json={"texts": ["a", "CRASH now"]})
        assert r.status_code == 500
        error = error_of(r)
        assert error["type"] == "internal_error" and error["request_id"] == r.headers["X-Request-ID"]
        ok = await s.client.post("/v1/embed", json={"texts": ["a"]})
        assert ok.status_code == 200
        assert (await s.client.get("/health/ready")).status_code == 200


KEYS = small_settings(api_keys=["k-one", "k-two"])


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/embed", {"texts": ["x"]}),
        ("/v1/translate", {"text": "x"}),
        ("/v1/embeddings", {"input": "x"}),
        ("/v1/models", None),
    ],
)
async def test_api_keys_protect_the_model_routes(path: str, body: dict[str, object] | None) -> None:
    async with serving(KEYS) as s:

        async def call(headers: dict[str, str]) -> httpx.Response:
            if body is None:
                return await s.client.get(path, headers=headers)
            return await s.client.post(path, json=body, headers=headers)

        missing = await call({})
        assert missing.status_code == 401 and error_of(missing)["type"] == "unauthorized"
        assert missing.headers["WWW-Authenticate"] == "Bearer"
        wrong = await call({"Authorization": "Bearer k-three"})
        assert wrong.status_code == 403 and error_of(wrong)["type"] == "forbidden"
        for key in ("k-one", "k-two"):
            assert (await call({"Authorization": f"Bearer {key}"})).status_code == 200


async def test_health_metrics_and_docs_need_no_key() -> None:
    async with serving(KEYS) as s:
        for path in ("/health/live", "/health/ready", "/metrics", "/openapi.json"):
            assert (await s.client.get(path)).status_code == 200, path


async def test_cors_only_when_configured() -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    async with serving(small_settings(cors_origins=["https://app.example"])) as s:
        r = await s.client.options("/v1/embed", headers=preflight)
        assert r.headers["access-control-allow-origin"] == "https://app.example"
    async with serving() as s:
        r = await s.client.options("/v1/embed", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
