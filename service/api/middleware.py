"""Plain ASGI middleware (not ``BaseHTTPMiddleware``: that one wraps ``receive``, hiding client
disconnects from the routes, and copies every response body)."""

from __future__ import annotations

import re
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import BodyTooLarge, error_response
from service.metrics import INFLIGHT, REQUEST_LATENCY, REQUESTS

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestContextMiddleware:
    """A request id (the client's ``X-Request-ID`` when sane, else a new one) on the request and
    the response, and the request metrics, labelled by route template (never the raw path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500  # unless a response starts

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        INFLIGHT.inc()
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            INFLIGHT.dec()
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "other"
            REQUEST_LATENCY.labels(endpoint=endpoint).observe(time.perf_counter() - start)
            REQUESTS.labels(endpoint=endpoint, status=str(status)).inc()


class BodyLimitMiddleware:
    """413 for a body over ``max_bytes``: at once from Content-Length, else while it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(
                413,
                "body_too_large",
                f"request body larger than {self.max_bytes} bytes",
                limit=self.max_bytes,
            )
            response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)
