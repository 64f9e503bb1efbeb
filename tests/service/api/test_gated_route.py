"""``GatedRoute`` answers as FastAPI's own ``APIRoute`` does, with the same OpenAPI, and refuses
the declarations it does not serve."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse, Response

from service.api.gated_route import GatedRoute

pytestmark = pytest.mark.anyio


class Body(BaseModel):
    texts: list[str] = Field(min_length=1, max_length=3)
    beam: int = Field(default=1, ge=1)


async def key_gate(request: Request) -> None:
    if request.headers.get("x-key") != "k":
        raise HTTPException(401, "no key")


async def ready_gate(request: Request) -> str:
    request.state.calls = getattr(request.state, "calls", 0) + 1
    if request.headers.get("x-ready") == "no":
        raise HTTPException(503, "not ready")
    return "model"


def app_with(route_class: type) -> FastAPI:
    router = APIRouter(route_class=route_class)

    @router.post("/echo")
    async def echo(
        body: Body,
        request: Request,
        model: Annotated[str, Depends(ready_gate)],
        again: Annotated[str, Depends(ready_gate)],
    ) -> Response:
        return JSONResponse(
            {
                "texts": body.texts,
                "beam": body.beam,
                "model": model,
                "again": again,
                "calls": request.state.calls,
            }
        )

    @router.get("/plain")
    async def plain(model: Annotated[str, Depends(ready_gate)]) -> Response:
        return JSONResponse({"model": model})

    app = FastAPI()
    app.include_router(router, dependencies=[Depends(key_gate)])
    return app


KEY = {"x-key": "k"}
JSON = {**KEY, "content-type": "application/json"}
CASES: list[tuple[str, str, dict[str, str], bytes]] = [
    ("valid", "/echo", JSON, b'{"texts": ["a", "b"], "beam": 2}'),
    ("defaults", "/echo", {**KEY, "content-type": "application/json; charset=utf-8"}, b'{"texts": ["a"]}'),
    ("+json media type", "/echo", {**KEY, "content-type": "application/vnd.api+json"}, b'{"texts": ["a"]}'),
    ("no key", "/echo", {"content-type": "application/json"}, b'{"texts": ["a"]}'),
    ("invalid JSON, no key", "/echo", {"content-type": "application/json"}, b'{"texts": ['),
    ("invalid JSON", "/echo", JSON, b'{"texts": [}'),
    ("not ready, bad body", "/echo", {**JSON, "x-ready": "no"}, b'{"texts": []}'),
    ("empty body", "/echo", JSON, b""),
    ("schema violations", "/echo", JSON, b'{"texts": [], "beam": 0}'),
    ("wrong type", "/echo", JSON, b'{"texts": "a", "beam": "x"}'),
    ("a list", "/echo", JSON, b"[1, 2]"),
    ("text/plain", "/echo", {**KEY, "content-type": "text/plain"}, b'{"texts": ["a"]}'),
    ("no content type", "/echo", KEY, b'{"texts": ["a"]}'),
    ("not UTF-8", "/echo", JSON, b'{"texts": ["\xff\xfe"]}'),
    ("4,301 digits", "/echo", JSON, b'{"texts": ["a"], "beam": ' + b"9" * 4301 + b"}"),
    ("no body route", "/plain", KEY, b""),
    ("no body route, not ready", "/plain", {**KEY, "x-ready": "no"}, b""),
]


async def answers(
    app: FastAPI, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, Any]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.request(method, path, headers=headers, content=body)
    return response.status_code, response.json()


@pytest.mark.parametrize(("case", "path", "headers", "body"), CASES, ids=[c[0] for c in CASES])
async def test_it_answers_as_fastapis_route_does(
    case: str, path: str, headers: dict[str, str], body: bytes
) -> None:
    method = "GET" if path == "/plain" else "POST"
    fastapis = await answers(app_with(APIRoute), method, path, headers, body)
    assert await answers(app_with(GatedRoute), method, path, headers, body) == fastapis


async def test_a_dependency_named_twice_runs_once() -> None:
    status, answer = await answers(app_with(GatedRoute), "POST", "/echo", JSON, b'{"texts": ["a"]}')
    assert status == 200
    assert answer["model"] == answer["again"] == "model"
    assert answer["calls"] == 1


def test_its_openapi_is_fastapis() -> None:
    assert app_with(GatedRoute).openapi() == app_with(APIRoute).openapi()


async def _with_query(body: Body, beam: int) -> Response:
    return Response()


async def _needs_gate(gate: Annotated[None, Depends(key_gate)]) -> None:
    return None


async def _nested(ok: Annotated[None, Depends(_needs_gate)]) -> Response:
    return Response()


def _sync_gate(request: Request) -> None:
    return None


async def _sync(ok: Annotated[None, Depends(_sync_gate)]) -> Response:
    return Response()


@pytest.mark.parametrize(
    ("endpoint", "refusal"),
    [(_with_query, "query"), (_nested, "not a gate"), (_sync, "not a gate")],
    ids=["a query parameter", "a dependency with its own", "a sync dependency"],
)
def test_it_refuses_what_it_does_not_serve(endpoint: Any, refusal: str) -> None:
    router = APIRouter(route_class=GatedRoute)
    with pytest.raises(TypeError, match=refusal):
        router.post("/x")(endpoint)
