"""``DirectDispatch``: the JSON model routes reached without the router.

Below the middlewares, a request passes Starlette's exception layer, FastAPI's exit-stack layer,
the router (which tries the routes in order, each included router through the effective routes
FastAPI builds for it) and ``request_response`` before its ``GatedRoute`` handler runs, a cost
every small request pays (docs/decisions.md, "The hot JSON routes skip FastAPI's per-request
dependency solving"). ``DirectDispatch`` is the innermost middleware. A request whose
method and path are a ``GatedRoute``'s (these routes take no path parameters, so the match is
exact) goes straight to that route's handler (``gated_handler``), under the app's exception
handlers as the router would have run it; every other request goes on down the stack. A
route that an earlier route also matches stays with the router, which picks the first match.

Everything above this middleware is unchanged (the server-error layer, the app's middlewares,
body limits, request ids, metrics), and so is what the route does. What the skipped layers give
other routes, the routes it takes do not use: ``GatedRoute`` refuses form bodies (files closed
by the exit stack) and dependencies with ``yield``, and does not consult
``app.dependency_overrides``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import fastapi.routing
from fastapi import FastAPI
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.gated_route import GatedRoute, Handler, gated_handler


class DirectDispatch:
    """The innermost middleware of ``service``: its ``GatedRoute`` requests served directly."""

    def __init__(self, app: ASGIApp, service: FastAPI) -> None:
        self.app = app
        # Built with the middleware stack, when the app is first called (its lifespan's start):
        # its routes and exception handlers are complete by then.
        handlers = {k: v for k, v in service.exception_handlers.items() if k not in (500, Exception)}
        self.routes: dict[tuple[str, str], tuple[Any, ASGIApp]] = {
            key: (route, ExceptionMiddleware(_served(handler), handlers))
            for key, (route, handler) in direct_routes(service.routes).items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A root path (behind a proxy's prefix) leaves matching to the router.
        if scope["type"] == "http" and not scope.get("root_path"):
            direct = self.routes.get((scope["method"], scope["path"]))
            if direct is not None:
                route, app = direct
                scope["route"] = route  # as the router sets it: the metrics' endpoint label
                await app(scope, receive, send)
                return
        await self.app(scope, receive, send)


def direct_routes(routes: Iterable[Any]) -> dict[tuple[str, str], tuple[Any, Handler]]:
    """(method, path) → (the route, its handler) for each ``GatedRoute`` that no earlier route
    also matches."""
    contexts = _contexts(routes)
    table: dict[tuple[str, str], tuple[Any, Handler]] = {}
    for i, context in enumerate(contexts):
        route = getattr(context, "original_route", context)
        if not isinstance(route, GatedRoute):
            continue
        handler = gated_handler(context)
        for method in sorted(context.methods or ()):
            if not any(_may_match(earlier, method, context.path) for earlier in contexts[:i]):
                table[method, context.path] = (route, handler)
    return table


def _contexts(routes: Iterable[Any]) -> list[Any]:
    """The routes as served, in the router's order: FastAPI 0.16x keeps included routers as
    such and builds their effective routes (``iter_route_contexts``); earlier FastAPIs copied
    the included routes into the app's list."""
    iterate = getattr(fastapi.routing, "iter_route_contexts", None)
    return list(iterate(list(routes))) if iterate is not None else list(routes)


def _may_match(route: Any, method: str, path: str) -> bool:
    """Whether the router could pick ``route`` for ``method`` and ``path`` (a route it cannot
    read, a host route for one, may)."""
    regex = getattr(route, "path_regex", None)
    if regex is None:
        return True
    methods = getattr(route, "methods", None)
    return regex.match(path) is not None and (methods is None or method in methods)


def _served(handler: Handler) -> ASGIApp:
    """``handler`` as an ASGI app (what ``request_response`` makes of it, without its exit stacks)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await handler(Request(scope, receive, send))
        await response(scope, receive, send)

    return app
