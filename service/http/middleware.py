"""Plain ASGI middleware (not ``BaseHTTPMiddleware``: that one wraps ``receive``, hiding client
disconnects from the routes, and copies every response body)."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.error_responses import (
    BodyNotUtf8,
    BodyTimeout,
    BodyTooLarge,
    is_json,
    renderer_for,
)
from service.api.extensions import BODY_RECEIVED_EXTENSION, SERVER_TIMING_STAGES
from service.metrics import INFLIGHT, REQUEST_LATENCY, REQUESTS, labelled
from service.serving.failures import Failure

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# New request ids: 128 random bits from a generator seeded once from the OS, not a system call
# per request (uuid4); they must be unique, not secret.
_new_ids = random.Random()
_UTF8 = {"utf-8", "utf8"}
_UTF16_OR_32_BOMS = (b"\xfe\xff", b"\xff\xfe")


def request_id_from(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-ID`` when it is sane, else a new one."""
    given = dict(headers).get(b"x-request-id", b"").decode("latin-1")
    return given if _REQUEST_ID.match(given) else f"{_new_ids.getrandbits(128):032x}"


class RequestContextMiddleware:
    """A request id (the client's ``X-Request-ID`` when sane, else a new one) on the request and
    the response, and the request metrics, labelled by route template (never the raw path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(scope.get("headers") or [])
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
            labelled(REQUEST_LATENCY, endpoint).observe(time.perf_counter() - start)
            labelled(REQUESTS, endpoint, str(status)).inc()


class BodyLimitMiddleware:
    """The body's limits, checked as it arrives, before any of it is parsed:

    - size: 413 over ``max_bytes``, at once from Content-Length, else while it streams in;
    - time: 408 when the whole body has not arrived ``timeout_s`` after the headers (a client
      that declares 1000 bytes and sends 13 is answered, not waited for); a body the server says
      has arrived (``BODY_RECEIVED_EXTENSION``, the usual one-packet request) is read without
      arming a timer;
    - format: 415 for a ``Content-Encoding`` (bodies are not decompressed), 400 for a JSON body
      declaring a charset other than UTF-8 or encoded in UTF-16/32 (which ``json.loads`` would
      otherwise detect and accept).

    Every refusal leaves the rest of the body unread, so its response closes the connection.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        refusal = self._refusal(headers)
        if refusal is not None:
            response = renderer_for(scope["path"])(refusal, None)
            response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        arrived = scope.get("extensions", {}).get(BODY_RECEIVED_EXTENSION)
        received = 0
        head = b""  # the body's first bytes, enough to tell UTF-16/32 from UTF-8
        complete = False

        async def limited_receive() -> Message:
            nonlocal received, head, complete
            if complete:  # the body is in; what remains is the wait for a disconnect
                return await receive()
            if arrived is not None and arrived.done():
                message = await receive()  # buffered: no wait to bound
            else:
                try:
                    async with asyncio.timeout_at(deadline):
                        message = await receive()
                except TimeoutError:
                    raise BodyTimeout(self.timeout_s) from None
            if message["type"] != "http.request":
                return message
            body = message.get("body", b"")
            received += len(body)
            if received > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            if len(head) < 2:
                head += body[: 2 - len(head)]
                if len(head) == 2 and (head in _UTF16_OR_32_BOMS or 0 in head):
                    raise BodyNotUtf8("it is UTF-16 or UTF-32")
            complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)

    def _refusal(self, headers: dict[bytes, bytes]) -> Failure | None:
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            message = f"request body larger than {self.max_bytes} bytes"
            return Failure(413, "body_too_large", message, self.max_bytes)
        encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
        if encoding != "identity":
            message = f"Content-Encoding {encoding!r} is not supported: send the body uncompressed"
            return Failure(415, "unsupported_media_type", message, "identity")
        media, _, parameters = headers.get(b"content-type", b"").decode("latin-1").partition(";")
        charset = _parameter(parameters, "charset")
        if is_json(media) and charset is not None and charset.lower() not in _UTF8:
            message = f"the request body must be UTF-8 (Content-Type declares charset={charset})"
            return Failure(400, "bad_request", message, "utf-8")
        return None


def _parameter(parameters: str, name: str) -> str | None:
    for part in parameters.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == name:
            return value.strip().strip('"')
    return None


# ---- Server-Timing ---------------------------------------------------------------------------


class ServerTimingMiddleware:
    """A W3C ``Server-Timing`` header on the model routes with this request's own stages: the body's
    arrival, what the route timed (``timed_stage``), and the total until the response starts (the
    response is rendered by then; only its sending is left out)."""

    def __init__(self, app: ASGIApp, path_prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.path_prefixes = path_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.path_prefixes):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        body_s: float | None = None

        async def timed_receive() -> Message:
            nonlocal body_s
            message = await receive()
            if body_s is None and message["type"] == "http.request" and not message.get("more_body"):
                body_s = time.perf_counter() - start
            return message

        async def send_with_timing(message: Message) -> None:
            if message["type"] == "http.response.start":
                stages = [] if body_s is None else [("body", body_s, "request body received")]
                stages += scope.get("state", {}).get(SERVER_TIMING_STAGES, [])
                stages.append(("total", time.perf_counter() - start, "until the response starts"))
                MutableHeaders(scope=message)["Server-Timing"] = ", ".join(
                    f'{name};dur={seconds * 1000:.2f};desc="{description}"'
                    for name, seconds, description in stages
                )
            await send(message)

        await self.app(scope, timed_receive, send_with_timing)
