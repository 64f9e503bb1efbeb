"""The hot routes, served ahead of FastAPI's router by plain endpoints.

FastAPI serves a request by walking its exception and exit-stack layers and the router (which
tries the routes in order, an included router's through the routes it builds for it), reading
the content type with ``email.message``, and solving the route's whole dependency tree, every
node extracting the path, query, header and cookie parameters again: on a one-sentence request
that is a large share of the server's CPU (docs/decisions.md, "The hot routes are plain endpoints ahead of
FastAPI's router"). The hot routes need none of it.

``HotPath`` sits just above the router (the innermost middleware): a request whose method and
path are in its table runs that table's endpoint, a plain ``Request → Response`` function,
under the app's error handlers; every other request, and any under a root path, goes on to the
router. The hot routes stay declared to FastAPI as they are (the OpenAPI document, the 405 for
another method, and FastAPI serving them where no ``HotPath`` is in front, which the tests
compare with).

``json_endpoint`` serves a route declared ``endpoint(body: Model, request, runtime)`` in
FastAPI's order, each step named: the body read and decoded (invalid JSON: the
``json_invalid`` 422; a body that cannot be decoded at all: the 400), the API key, the route's
runtime dependency (readiness, the model), the body validated (422, locations under ``body``),
then the endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.dependencies import check_bearer_key
from service.api.errors import REQUEST_ERROR_HANDLERS, is_json
from service.serving.runtime import Runtime

M = TypeVar("M", bound=BaseModel)

Endpoint = Callable[[Request], Awaitable[Response]]
# (method, path) → its endpoint: exact paths, as the hot routes take no path parameters.
HotRoutes = Mapping[tuple[str, str], Endpoint]


class HotPath:
    """The innermost middleware: the requests for ``routes`` served by their endpoints, not the router."""

    def __init__(self, app: ASGIApp, routes: HotRoutes) -> None:
        self.app = app
        self.routes = {key: _Served(key[1], endpoint) for key, endpoint in routes.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Under a root path (behind a proxy's prefix) the router strips it before matching.
        if scope["type"] == "http" and not scope.get("root_path"):
            served = self.routes.get((scope["method"], scope["path"]))
            if served is not None:
                scope["route"] = served  # as the router sets it: the metrics' endpoint label
                await served.app(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Served:
    """One hot route: its path (what the metrics label it by) and its endpoint as an ASGI app
    under the app's handlers of a request's failures, as the router's ``request_response`` runs
    an endpoint (an unexpected exception goes up to the server-error layer either way)."""

    def __init__(self, path: str, endpoint: Endpoint) -> None:
        self.path = path

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            response = await endpoint(Request(scope, receive, send))
            await response(scope, receive, send)

        self.app = ExceptionMiddleware(app, dict(REQUEST_ERROR_HANDLERS))


def json_endpoint(
    endpoint: Callable[[M, Request, Runtime], Awaitable[Response]],
    model: type[M],
    runtime: Callable[[Request], Awaitable[Runtime]],
) -> Endpoint:
    """``endpoint``, declared to FastAPI with a ``model`` body and ``runtime`` as its dependency
    (behind the API key), served as FastAPI serves it."""

    async def serve(request: Request) -> Response:
        received = await read_json(request)
        check_bearer_key(request)
        served = await runtime(request)
        body = validated(model, received)
        return await endpoint(body, request, served)

    return serve


_NO_BODY = object()


async def read_json(request: Request) -> Any:
    """The body as FastAPI reads one: decoded when its content type is JSON, else its bytes."""
    try:
        raw = await request.body()
        if not raw:
            return _NO_BODY
        return json.loads(raw) if is_json(request.headers.get("content-type", "")) else raw
    except json.JSONDecodeError as e:
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": e.msg}}], body=e.doc) from e
    except HTTPException:
        raise  # the body limits' 408, 413 and 400
    except Exception as e:  # not UTF-8/16/32, an integer of more than 4,300 digits, ...
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from e


def validated(model: type[M], received: Any) -> M:
    """``received`` as ``model``, or FastAPI's 422 with each problem located under ``body``."""
    if received is _NO_BODY:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    try:
        return model.model_validate(received, from_attributes=True)  # as FastAPI validates a body
    except ValidationError as e:
        problems = [{**p, "loc": ("body", *p["loc"])} for p in e.errors(include_url=False)]
        raise RequestValidationError(problems, body=received) from e
