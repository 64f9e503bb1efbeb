"""What the routes share: the runtime (``service/serving/runtime.py``), what admits a request (the API
key, readiness), the client's disconnect, and ``HttpClient``, what the serving layer
(``service/serving/``) is handed of an HTTP request. HTTP only: the checks themselves are the
serving layer's.

The admission checks are async functions of the request alone: FastAPI runs them as the routes'
declared dependencies, and the hot path (``service/api/hot_path.py``) calls the same ones, read
from those declarations, with the request.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from contextlib import AbstractContextManager
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from service.api.error_responses import ClientDisconnected
from service.api.extensions import DISCONNECT_EXTENSION, timed_stage
from service.serving.access import check_api_key, ready
from service.serving.runtime import Runtime

T = TypeVar("T")


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def serving_runtime(request: Request) -> Runtime:
    """``ready`` as a route dependency: async, as FastAPI runs a sync dependency on a worker
    thread (a thread hop per request)."""
    return ready(runtime_of(request))


# A route's ``runtime`` parameter: the runtime once the service is ready.
ServingRuntime = Annotated[Runtime, Depends(serving_runtime)]


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, read as FastAPI's ``HTTPBearer``
    reads it (any other scheme, or none: no token)."""
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    return token if token and scheme.lower() == "bearer" else None


def check_bearer_key(request: Request) -> None:
    """``check_api_key`` on the bearer token: 401 without one, 403 with a wrong one."""
    keys = runtime_of(request).settings.api_keys
    if keys:
        check_api_key(keys, [bearer_token(request)])


class ApiKeyGate(HTTPBearer):
    """``check_bearer_key`` as a route dependency: an ``HTTPBearer``, so OpenAPI shows the scheme."""

    async def __call__(self, request: Request) -> None:  # type: ignore[override]
        check_bearer_key(request)


require_api_key = ApiKeyGate(
    auto_error=False, scheme_name="HTTPBearer", description="One of TSERVE_API_KEYS (when set)"
)


class HttpClient:
    """The serving layer's ``Client`` for an HTTP request: stages go into its ``Server-Timing``
    header, and its work stops when the connection is lost (``until_disconnect``)."""

    def __init__(self, request: Request) -> None:
        self.request = request

    def timed(self, stage: str, description: str) -> AbstractContextManager[None]:
        return timed_stage(self.request.scope, stage, description)

    async def unless_gone(self, work: Awaitable[T]) -> T:
        return await until_disconnect(self.request, work)


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first: then cancel it (its queued items are
    dropped by the queue) and raise ``ClientDisconnected``. Starlette does not cancel a
    handler when its client leaves, so without this the work would be computed for nobody.

    Under the service's own server the connection says when it is lost (``DISCONNECT_EXTENSION``):
    the request's task is cancelled from that future, with no task or wait of its own per
    request, which costs less than a watcher (docs/decisions.md, "The connection tells the
    request when its client is gone"). Elsewhere a watcher task waits for ASGI's
    ``http.disconnect``.
    """
    disconnected = request.scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
    if disconnected is None:
        return await _watching_receive(request, work)
    if disconnected.done():
        if inspect.iscoroutine(work):
            work.close()  # never started
        elif isinstance(work, asyncio.Future):
            work.cancel()
        raise ClientDisconnected()
    task = asyncio.current_task()
    assert task is not None
    waiting, cancelled = True, False

    def cancel(_: object) -> None:
        nonlocal cancelled
        if waiting:  # a callback scheduled just before the work ended must not cancel what follows
            cancelled = True
            task.cancel()

    disconnected.add_done_callback(cancel)
    try:
        return await work
    except asyncio.CancelledError:
        if cancelled and task.uncancel() == 0:  # ours alone: nobody else cancelled the request
            raise ClientDisconnected() from None
        raise
    finally:
        waiting = False
        disconnected.remove_done_callback(cancel)


async def _watching_receive(request: Request, work: Awaitable[T]) -> T:
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientDisconnected()
