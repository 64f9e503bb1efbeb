"""The hot routes are served ahead of FastAPI's router (``HotPath``), and answer every request as
FastAPI answers it when it serves their declarations itself: the same status, body and headers,
valid or not, with or without a key, ready or not, whatever the body's encoding."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter, Body, Depends, FastAPI, Request
from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.api.hot_path import HotPath, hot
from service.serving import embedding, translation
from tests.service.api.conftest import Served, metric, serving, small_settings
from tests.service.small_engines import HashEmbedder, ReverseTranslator

pytestmark = pytest.mark.anyio

KEY = "k"
SETTINGS = small_settings(api_keys=[KEY], max_body_bytes=16_384)  # room for 4,301 digits
HOT = {
    "/v1/translate": b'{"text": ["hello world"], "beam_size": 2}',
    "/v1/embed": b'{"texts": ["hello", "world"]}',
    "/v1/embeddings": b'{"input": "hello", "encoding_format": "base64"}',
    "/translate": b'{"q": "hello", "source": "en", "target": "de", "alternatives": 1}',
    "/embed": b'{"inputs": ["hello", "world"]}',  # TEI's
    "/": b'{"inputs": "hello"}',  # TEI's root
}
AUTH = {"authorization": f"Bearer {KEY}"}
JSON = {**AUTH, "content-type": "application/json"}
# Every way a request may go wrong before its work, and two ways it goes right.
CASES: list[tuple[str, dict[str, str], bytes | None]] = [
    ("valid", JSON, None),
    ("+json and a charset", {**AUTH, "content-type": "application/vnd.api+json; charset=utf-8"}, None),
    ("no key", {"content-type": "application/json"}, None),
    ("no key, an empty object", {"content-type": "application/json"}, b"{}"),
    ("a wrong key", {**JSON, "authorization": "Bearer nope"}, None),
    ("another scheme", {**JSON, "authorization": f"Basic {KEY}"}, None),
    ("invalid JSON, no key", {"content-type": "application/json"}, b'{"text": ['),
    ("invalid JSON", JSON, b'{"text": [}'),
    ("empty body", JSON, b""),
    ("an empty object", JSON, b"{}"),
    ("schema violations", JSON, b'{"text": [], "texts": [], "input": [], "q": [], "beam_size": 0}'),
    ("unknown fields", JSON, b'{"text": "a", "texts": ["a"], "input": "a", "q": "a", "extra": 1}'),
    ("a list", JSON, b"[1, 2]"),
    ("text/plain", {**AUTH, "content-type": "text/plain"}, None),
    ("no content type", AUTH, None),
    ("not UTF-8", JSON, b'{"text": ["\xff\xfe"]}'),
    ("4,301 digits", JSON, b'{"text": ["a"], "beam_size": ' + b"9" * 4301 + b"}"),
    ("nested too deeply", JSON, b"[" * 5_000 + b"]" * 5_000),
]
COMPARED_HEADERS = ("content-type", "www-authenticate", "retry-after", "connection", "allow")


def same_named_engines() -> dict[str, Any]:
    """Fresh engines with fixed names, so that two apps' answers name the same models."""
    return {"embed": HashEmbedder(name="hot-embed"), "translate": ReverseTranslator(name="hot-translate")}


def without_hot_path(app: FastAPI) -> None:
    """The app as FastAPI alone serves it: every request through the router."""
    app.user_middleware = [m for m in app.user_middleware if m.cls is not HotPath]
    app.middleware_stack = None  # rebuilt on the next request


@asynccontextmanager
async def hot_and_routed(
    tasks: tuple[str, ...] = ("embed", "translate"),
) -> AsyncIterator[tuple[Served, Served]]:
    """The app over engines for ``tasks``, twice: with its hot path, and served by FastAPI alone."""
    engines = [{task: e for task, e in same_named_engines().items() if task in tasks} for _ in range(2)]
    async with serving(SETTINGS, engines[0]) as hot, serving(SETTINGS, engines[1]) as routed:
        without_hot_path(routed.app)
        yield hot, routed


async def answer(served: Served, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
    request_id = {"x-request-id": "the-same-id"}  # invalid requests and 5xx answers carry it
    response = await served.client.request(method, path, headers={**headers, **request_id}, content=body)
    kept = {name: response.headers.get(name) for name in COMPARED_HEADERS}
    return response.status_code, response.content, kept


@contextmanager
def runtime_state(apps: list[FastAPI], state: str) -> Iterator[None]:
    for app in apps:
        app.state.runtime.state = state
    try:
        yield
    finally:
        for app in apps:
            app.state.runtime.state = "ready"


async def test_every_hot_request_is_answered_as_fastapi_answers_it() -> None:
    async with hot_and_routed() as (hot, routed):
        for path, valid in HOT.items():
            for case, headers, body in CASES:
                sent = valid if body is None else body
                expected = await answer(routed, "POST", path, headers, sent)
                assert expected[0] == 200 or case != "valid"
                assert await answer(hot, "POST", path, headers, sent) == expected, (path, case)
            for state in ("loading", "draining"):
                with runtime_state([hot.app, routed.app], state):
                    for headers, sent in ((JSON, valid), (JSON, b"{}"), ({}, valid)):
                        expected = await answer(routed, "POST", path, headers, sent)
                        assert expected[0] == 503 or sent != valid or headers != JSON
                        assert await answer(hot, "POST", path, headers, sent) == expected, (path, state)
            expected = await answer(routed, "GET", path, JSON, b"")  # another method: the router's 405
            assert expected[0] == (200 if path == "/" else 405)  # GET / is the playground
            assert await answer(hot, "GET", path, JSON, b"") == expected


async def test_without_an_embedding_model_the_same_404_comes_before_validation() -> None:
    async with hot_and_routed(tasks=("translate",)) as (hot, routed):
        for path in ("/v1/embed", "/v1/embeddings"):
            for sent in (HOT[path], b"{}"):
                expected = await answer(routed, "POST", path, JSON, sent)
                assert expected[0] == 404
                assert await answer(hot, "POST", path, JSON, sent) == expected


@pytest.mark.parametrize("path", list(HOT))
async def test_an_unexpected_failure_is_the_same_500(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(translation, "translate", fails)
    monkeypatch.setattr(embedding, "embed", fails)
    async with hot_and_routed() as (hot, routed):
        expected = await answer(routed, "POST", path, JSON, HOT[path])
        assert expected[0] == 500
        assert await answer(hot, "POST", path, JSON, HOT[path]) == expected


def hot_path_of(app: FastAPI) -> HotPath:
    layer: Any = app.middleware_stack
    while not isinstance(layer, HotPath):
        layer = layer.app
    return layer


def reaching_the_router(app: FastAPI) -> list[str]:
    """The requests that the hot path passes on to the router from now on, as "METHOD path"."""
    hot_path = hot_path_of(app)
    below = hot_path.app
    reached: list[str] = []

    async def spy(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(f"{scope['method']} {scope['path']}")
        await below(scope, receive, send)

    hot_path.app = spy
    return reached


async def test_the_hot_requests_never_reach_the_router_and_the_rest_do() -> None:
    async with serving(SETTINGS) as s:
        reached = reaching_the_router(s.app)
        for path, body in HOT.items():
            assert (await s.client.post(path, headers=JSON, content=body)).status_code == 200
        assert (await s.client.get("/v1/models", headers=AUTH)).status_code == 200
        assert (await s.client.get("/v1/translate", headers=AUTH)).status_code == 405
        assert reached == ["GET /v1/models", "GET /v1/translate"]


async def test_the_hot_routes_are_the_declared_ones_counted_under_their_path() -> None:
    """The hot path labels a request's metrics by its route's path, as the router labels it by
    the route it picks for the same request."""
    async with hot_and_routed() as (hot, routed):
        assert sorted(hot_path_of(hot.app).routes) == sorted(("POST", path) for path in HOT)
        for path, body in HOT.items():
            before = metric("tserve_requests_total", endpoint=path, status="200")
            for served in (hot, routed):
                assert (await served.client.post(path, headers=JSON, content=body)).status_code == 200
            assert metric("tserve_requests_total", endpoint=path, status="200") == before + 2


async def test_under_a_root_path_the_router_serves_them() -> None:
    async with serving(SETTINGS) as s:
        reached = reaching_the_router(s.app)
        transport = httpx.ASGITransport(app=s.app, root_path="/api")
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.post("/api/v1/translate", headers=JSON, content=HOT["/v1/translate"])
        assert response.status_code == 200 and response.json()["translations"]
        assert reached == ["POST /api/v1/translate"]


async def test_the_hot_routes_keep_their_openapi_declarations() -> None:
    async with serving(SETTINGS) as s:
        paths = (await s.client.get("/openapi.json")).json()["paths"]
    for path, model in (
        ("/v1/translate", "TranslateRequest"),
        ("/v1/embed", "EmbedRequest"),
        ("/v1/embeddings", "OpenAIEmbeddingRequest"),
    ):
        operation = paths[path]["post"]
        body = operation["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
        assert operation["security"] == [{"HTTPBearer": []}]
        assert {"401", "403", "422", "503"} <= set(operation["responses"])
    libretranslate = paths["/translate"]["post"]["requestBody"]["content"]
    assert set(libretranslate) == {
        "application/json",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    }


class Sent(BaseModel):
    text: str


def with_a_query_parameter(router: APIRouter) -> None:
    @router.post("/hot")
    @hot
    async def endpoint(request: Request, q: int) -> Response:
        return Response()


def with_an_embedded_body(router: APIRouter) -> None:
    @router.post("/hot")
    @hot
    async def endpoint(body: Annotated[Sent, Body(embed=True)], request: Request) -> Response:
        return Response()


def sync_dependency(request: Request) -> None:
    pass


def with_a_sync_dependency(router: APIRouter) -> None:
    @router.post("/hot", dependencies=[Depends(sync_dependency)])
    @hot
    async def endpoint(request: Request) -> Response:
        return Response()


@pytest.mark.parametrize("declare", [with_a_query_parameter, with_an_embedded_body, with_a_sync_dependency])
def test_a_hot_route_served_otherwise_than_fastapi_would_is_refused_when_the_app_starts(
    declare: Callable[[APIRouter], None],
) -> None:
    router = APIRouter()
    declare(router)
    app = FastAPI()
    app.include_router(router)
    with pytest.raises(TypeError, match="hot route /hot"):
        HotPath(app.router, app.routes)
