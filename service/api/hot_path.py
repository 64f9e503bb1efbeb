"""The hot routes, served ahead of FastAPI's router by plain endpoints.

FastAPI serves a request by walking its exception and exit-stack layers and the router (which
tries the routes in order, an included router's through the routes it builds for it), reading
the content type with ``email.message``, and solving the route's whole dependency tree, every
node extracting the path, query, header and cookie parameters again: on a one-sentence request
that is a large share of the server's CPU (docs/decisions.md, "The hot routes are plain endpoints ahead of
FastAPI's router"). The hot routes need none of it.

A route is made hot where it is declared, by marking its endpoint ``@hot``; everything else
about it (path, method, body model, dependencies, the API key its router is included behind)
is read from FastAPI's own route, so it is written once. ``HotPath`` sits just above the router
(the innermost middleware): a request whose method and path are a hot route's runs that route's
plain endpoint under the app's error handlers; every other request, and any under a root path,
goes on to the router. The hot routes stay declared to FastAPI as they are (the OpenAPI
document, the 405 for another method, and FastAPI serving them where no ``HotPath`` is in front,
which the tests compare with).

``plain_endpoint`` serves a route in FastAPI's order, each step named: the body, when the route
declares one, read and decoded (invalid JSON: the ``json_invalid`` 422; a body that cannot be
decoded at all: the 400), the route's dependencies in order (the API key, readiness, the model),
the body validated (422, locations under ``body``), then the endpoint. A route whose body is
parsed by hand (LibreTranslate's) is its endpoint alone.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.error_responses import REQUEST_ERROR_HANDLERS, is_json

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E", bound=Callable[..., Awaitable[Response]])

Endpoint = Callable[[Request], Awaitable[Response]]
_HOT = "_tserve_hot_route"


def hot(endpoint: E) -> E:
    """Marks a route's endpoint to be served by ``HotPath`` rather than the router."""
    setattr(endpoint, _HOT, True)
    return endpoint


class HotPath:
    """The innermost middleware: the requests for the hot routes among ``routes`` (the app's,
    included routers' too) served by their plain endpoints, not the router. Exact paths: the hot
    routes take no path parameters."""

    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self.routes: dict[tuple[str, str], _Served] = {}
        for context in iter_route_contexts(list(routes)):
            route = context.original_route
            if isinstance(route, APIRoute) and getattr(route.endpoint, _HOT, False):
                path, methods = context.path, context.methods
                assert path is not None and methods is not None  # an API route's context has both
                served = _Served(path, plain_endpoint(context, route.endpoint))
                self.routes.update({(method, path): served for method in methods})

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


def plain_endpoint(route: RouteContext, endpoint: Callable[..., Awaitable[Response]]) -> Endpoint:
    """``route``, whose endpoint is ``endpoint``, served as FastAPI serves it (the module's
    docstring says how); a route declared otherwise than the hot path can serve is refused when
    the app is built."""
    dependant: Dependant = route.dependant
    if dependant.path_params or dependant.query_params or dependant.header_params or dependant.cookie_params:
        raise TypeError(f"hot route {route.path}: path, query, header or cookie parameters")
    body = _body(route)
    dependencies = [(_of_the_request(route, d), d.name) for d in dependant.dependencies]
    request_name = dependant.request_param_name

    async def serve(request: Request) -> Response:
        received = await read_json(request) if body else None
        arguments: dict[str, Any] = {request_name: request} if request_name else {}
        for dependency, name in dependencies:
            solved = await dependency(request)
            if name is not None:
                arguments[name] = solved
        if body:
            name, model = body
            arguments[name] = validated(model, received)
        return await endpoint(**arguments)

    return serve


def _body(route: RouteContext) -> tuple[str, type[BaseModel]] | None:
    """The name and model of ``route``'s body parameter, if it declares one: a pydantic model,
    the whole body (FastAPI embeds several, or one declared so, under their names)."""
    body_params = route.dependant.body_params
    if not body_params:
        return None
    field = route.body_field
    model = field.field_info.annotation
    if field is not body_params[0] or not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"hot route {route.path}: its body must be one pydantic model, not embedded")
    return field.name, model


def _of_the_request(route: RouteContext, dependency: Dependant) -> Callable[[Request], Awaitable[Any]]:
    """``dependency``'s function, which the hot path calls with the request alone: async (FastAPI
    would run it on a thread otherwise), and with no parameter or dependency of its own."""
    call = dependency.call
    alone = dependency.request_param_name is not None and not (
        dependency.path_params
        or dependency.query_params
        or dependency.header_params
        or dependency.cookie_params
        or dependency.body_params
        or dependency.dependencies
    )
    if call is None or not alone or not _is_async(call):
        raise TypeError(f"hot route {route.path}: {call!r} is not an async function of the request alone")
    return call


def _is_async(call: Callable[..., Any]) -> bool:
    """An async function, or an instance whose ``__call__`` is one (``ApiKeyGate``)."""
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(type(call).__call__)


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
