"""``GatedRoute``: a route declared the FastAPI way (so the same OpenAPI), served by a lean handler.

FastAPI (0.165) handles a request by parsing the content type with ``email.message`` and then
solving the route's whole dependency tree, every node extracting the path, query, header and
cookie parameters again: a large share of the app's CPU on a small request (docs/decisions.md,
"The hot JSON routes skip FastAPI's per-request dependency solving"). The JSON routes need
less: an optional body that is one pydantic model, the ``Request``, and *gates*, dependencies
that take the request alone (the API key, readiness, the model to use). A ``GatedRoute``
checks that shape when it is built and serves it in FastAPI's order, with FastAPI's errors:

1. the body is read and, when the content type is JSON, decoded (invalid JSON: the
   ``json_invalid`` 422; a body that cannot be decoded at all: the 400);
2. the gates run in declaration order, the router's first, each callable once;
3. the body is validated against its model (422, locations under ``body``);
4. the endpoint runs and returns a ``Response``.

Refused when the route is built: query, path, header or cookie parameters, dependencies with
parameters of their own, several or optional or form bodies. ``app.dependency_overrides`` is
not consulted.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Coroutine
from typing import Any

import fastapi.routing
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import get_missing_field_error
from fastapi.exceptions import RequestValidationError
from fastapi.params import Form
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from service.api.errors import is_json

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
Gate = Callable[[Request], Coroutine[Any, Any, Any]]

_NO_BODY = object()


class GatedRoute(APIRoute):
    """An ``APIRoute`` whose request handler runs the shape the module doc names (checked here)."""

    def get_route_handler(self) -> Handler:
        return gated_handler(_effective(self))


def gated_handler(route: Any) -> Handler:
    """The request handler of a ``GatedRoute`` as served: ``route`` is the route itself or its
    effective form where a router included it (its ``dependant`` then carries the router's gates)."""
    path: str = route.path
    dependant: Dependant = route.dependant
    _refuse_params(dependant, path)
    if _special_params(dependant):
        raise TypeError(f"{path}: a GatedRoute's endpoint takes the request, its body and gates")
    gates = _gates(dependant, path)
    body = dependant.body_params[0] if dependant.body_params else None
    if body is not None:
        if len(dependant.body_params) > 1 or isinstance(body.field_info, Form):
            raise TypeError(f"{path}: a GatedRoute takes one JSON body")
        if getattr(body.field_info, "embed", False) or not body.field_info.is_required():
            raise TypeError(f"{path}: a GatedRoute's body is one required, unembedded model")
    endpoint = dependant.call
    assert endpoint is not None and inspect.iscoroutinefunction(endpoint), path
    request_name = dependant.request_param_name

    async def handle(request: Request) -> Response:
        received = await _json_body(request) if body is not None else _NO_BODY
        values: dict[str, Any] = {}
        for gate, names in gates:
            result = await gate(request)
            for name in names:
                values[name] = result
        if body is not None:
            value, errors = (
                body.validate(received, {}, loc=("body",))
                if received is not _NO_BODY
                else (None, [get_missing_field_error(("body",))])
            )
            if errors:
                raise RequestValidationError(errors, body=None if received is _NO_BODY else received)
            values[body.name] = value
        if request_name is not None:
            values[request_name] = request
        response = await endpoint(**values)
        if not isinstance(response, Response):
            raise TypeError(f"{path}: a GatedRoute's endpoint returns a Response")
        return response

    return handle


def _effective(route: APIRoute) -> Any:
    """The route as included (with the including router's dependencies), as FastAPI's own
    ``get_route_handler`` finds it; the route itself where FastAPI builds included routes anew."""
    context_var = getattr(fastapi.routing, "_effective_route_context_var", None)
    context = context_var.get() if context_var is not None else None
    return context if context is not None and context.original_route is route else route


def _params(dependant: Dependant) -> list[Any]:
    """The path, query, header and cookie parameters FastAPI would extract for ``dependant``."""
    d = dependant
    return [*d.path_params, *d.query_params, *d.header_params, *d.cookie_params]


def _refuse_params(dependant: Dependant, path: str) -> None:
    if params := _params(dependant):
        names = ", ".join(p.name for p in params)
        raise TypeError(f"{path}: a GatedRoute takes no path, query, header or cookie parameters ({names})")


def _gates(dependant: Dependant, path: str) -> list[tuple[Gate, list[str]]]:
    """Each dependency's callable once, in order, with the parameters that receive its result."""
    gates: dict[Any, list[str]] = {}
    for sub in dependant.dependencies:
        call = sub.call
        takes_more = bool(sub.dependencies or sub.body_params or _params(sub)) or _special_params(sub)
        if call is None or sub.request_param_name is None or takes_more or not _is_async(call):
            raise TypeError(f"{path}: {call!r} is not a gate (an async callable of the request alone)")
        names = gates.setdefault(call, [])
        if sub.name is not None:
            names.append(sub.name)
    return list(gates.items())


def _special_params(dependant: Dependant) -> bool:
    """FastAPI's other injected parameters (response, background tasks, ...), not the request."""
    names = (
        dependant.http_connection_param_name,
        dependant.websocket_param_name,
        dependant.response_param_name,
        dependant.background_tasks_param_name,
        dependant.security_scopes_param_name,
    )
    return any(name is not None for name in names)


def _is_async(call: Any) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one (``ApiKeyGate``)."""
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(type(call).__call__)


async def _json_body(request: Request) -> Any:
    """FastAPI's reading of a body: decoded when its content type is JSON, else its bytes."""
    try:
        raw = await request.body()
        if not raw:
            return _NO_BODY
        return json.loads(raw) if is_json(request.headers.get("content-type", "")) else raw
    except json.JSONDecodeError as e:
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": e.msg}}], body=e.doc) from e
    except HTTPException:
        raise  # the body limits' 408 and 413
    except Exception as e:  # not UTF-8/16/32, an integer of more than 4,300 digits, ...
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from e
