"""``DirectDispatch`` serves the ``GatedRoute`` requests itself, answering as the router would,
and leaves every other request to the router."""

from __future__ import annotations

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.direct_dispatch import DirectDispatch, direct_routes
from service.api.gated_route import GatedRoute
from tests.service.api.test_gated_route import CASES, JSON, app_with

pytestmark = pytest.mark.anyio


class Handled(Exception):
    pass


class Unhandled(Exception):
    pass


async def on_handled(request: Request, exc: Exception) -> Response:
    return JSONResponse({"handled": str(exc)}, status_code=418)


def service_app(route_class: type, direct: bool) -> FastAPI:
    """``app_with``'s routes, two that raise, one the router keeps, and the app's handlers."""
    app = app_with(route_class)
    failing = APIRouter(route_class=route_class)

    @failing.post("/handled")
    async def handled() -> Response:
        raise Handled("teapot")

    @failing.post("/unhandled")
    async def unhandled() -> Response:
        raise Unhandled("boom")

    app.include_router(failing)
    app.add_api_route("/other", lambda: {"other": True}, methods=["GET"])
    app.add_exception_handler(Handled, on_handled)
    if direct:
        app.add_middleware(DirectDispatch, service=app)
    return app


async def answer(
    app: ASGIApp, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, str]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.request(method, path, headers=headers, content=body)
    return response.status_code, response.text


EXTRA_CASES = [
    ("a handled error", "/handled", JSON, b""),
    ("an unhandled error", "/unhandled", JSON, b""),
    ("a route of the router", "/other", {}, b""),
    ("no route", "/nowhere", JSON, b"{}"),
]


@pytest.mark.parametrize(
    ("case", "path", "headers", "body"), CASES + EXTRA_CASES, ids=[c[0] for c in CASES + EXTRA_CASES]
)
async def test_it_answers_as_the_router_does(
    case: str, path: str, headers: dict[str, str], body: bytes
) -> None:
    method = "GET" if path in ("/plain", "/other") else "POST"
    routed = await answer(service_app(APIRoute, direct=False), method, path, headers, body)
    assert await answer(service_app(GatedRoute, direct=True), method, path, headers, body) == routed


async def test_gated_requests_skip_the_router_and_the_rest_reach_it() -> None:
    app = service_app(GatedRoute, direct=True)
    await answer(app, "GET", "/other", {}, b"")  # builds the middleware stack
    dispatch = app.middleware_stack
    while not isinstance(dispatch, DirectDispatch):
        dispatch = dispatch.app  # type: ignore[union-attr]
    below = dispatch.app
    reached: list[str] = []

    async def spy(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["path"])
        await below(scope, receive, send)

    dispatch.app = spy
    assert (await answer(app, "POST", "/echo", JSON, b'{"texts": ["a"]}'))[0] == 200
    assert (await answer(app, "GET", "/plain", JSON, b""))[0] == 200
    assert (await answer(app, "GET", "/other", {}, b""))[0] == 200
    assert (await answer(app, "GET", "/echo", JSON, b""))[0] == 405  # the method is the router's to refuse
    assert reached == ["/other", "/echo"]


async def test_a_route_an_earlier_route_matches_stays_with_the_router() -> None:
    app = FastAPI()

    @app.post("/{anything}")
    async def catch_all(anything: str) -> Response:
        return PlainTextResponse("earlier")

    gated = APIRouter(route_class=GatedRoute)

    @gated.post("/later")
    async def later() -> Response:
        return PlainTextResponse("later")

    @gated.get("/later")
    async def later_get() -> Response:
        return PlainTextResponse("later, GET")

    app.include_router(gated)
    assert list(direct_routes(app.routes)) == [("GET", "/later")]
    app.add_middleware(DirectDispatch, service=app)
    assert await answer(app, "POST", "/later", {}, b"") == (200, "earlier")
    assert await answer(app, "GET", "/later", {}, b"") == (200, "later, GET")


async def test_under_a_root_path_the_router_matches() -> None:
    """Behind a proxy's prefix ``/a``, the path ``/a/b`` is the route ``/b``, not ``/a/b``."""
    app = FastAPI()
    gated = APIRouter(route_class=GatedRoute)
    for path in ("/a/b", "/b"):

        @gated.post(path)
        async def named(request: Request) -> Response:
            return PlainTextResponse(request.scope["route"].path)

    app.include_router(gated)
    app.add_middleware(DirectDispatch, service=app)
    transport = httpx.ASGITransport(app=app, root_path="/a")
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.post("/a/b")).text == "/b"


def test_the_service_serves_its_json_routes_directly() -> None:
    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings(translate_model=""))
    assert app.user_middleware[-1].cls is DirectDispatch  # innermost
    assert set(direct_routes(app.routes)) == {
        ("POST", "/v1/embed"),
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/translate"),
        ("GET", "/v1/models"),
    }
