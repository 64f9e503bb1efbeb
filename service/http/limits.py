"""The HTTP server's own limits against hostile clients: uvicorn's httptools protocol, bounded.

uvicorn gives an idle keep-alive timeout and nothing else a slow or greedy client needs to be
stopped: no header read timeout, no header size, count or request-line limit with httptools,
and ``limit_concurrency`` counts connections only to answer 503 once their headers are complete,
after they have held a descriptor for as long as they liked. This protocol adds, per connection:

- a **head deadline**: the request line and headers must be complete within ``header_timeout_s``
  of the connection's opening, or of the first byte of its next request, else 408 (or a plain
  close when not one byte came) — a slow-header client holds a descriptor that long at most;
  a client still trickling the unread body of a request already answered is cut
  ``header_timeout_s`` after the answer. Between requests a keep-alive connection idles up to
  ``keep_alive_timeout_s``, longer than the clients' and proxies' own idle expiry, so that they
  close it, not the server: a request sent on a connection the server closes that instant is
  reset (docs/decisions.md, "The keep-alive timeout is 75 s");
- a **head budget**: the request target within ``max_request_line_bytes`` (else 414), the
  header lines within ``max_header_bytes`` (else 431) and ``max_header_count`` (else 431). The
  parser is fed at most the budget, so an endless header costs that many bytes, not more;
- a **connection cap** (``max_connections``, by default the descriptor limit minus a reserve):
  a new connection beyond it sheds the connection that has waited longest without a request in
  progress, so probes and real clients get in while an attacker's idle sockets go; when every
  connection carries a request in progress, the new one gets 503 and is closed;
- every error it answers itself in the service's JSON shape with ``X-Request-ID``, parse errors
  (garbage, Content-Length with Transfer-Encoding, two Content-Lengths) included;
- two **signals** in each request's ASGI extensions (``service/api/extensions.py``): when its
  connection is lost before the response completes, and when its whole body has arrived.

The body deadline (``body_timeout_s`` → 408) is enforced where the body is read, in
``service.http.middleware.BodyLimitMiddleware``, so it passes through the app's error handling;
it arms no timer for a body that has already arrived.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import httptools
from prometheus_client import Counter, Gauge
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from service.api.extensions import BODY_RECEIVED_EXTENSION, DISCONNECT_EXTENSION
from service.api.schemas.tserve import ErrorBody, ErrorResponse
from service.http.middleware import request_id_from
from service.settings import Settings

log = logging.getLogger(__name__)

_LINGER_S = 2.0  # after refusing a request: time for the client to read the answer

OPEN_CONNECTIONS = Gauge("tserve_open_connections", "Open HTTP connections", multiprocess_mode="livesum")
CONNECTIONS_CLOSED = Counter(
    "tserve_connections_closed_total",
    "Connections the server closed to hold its limits, by reason",
    ["reason"],
)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    max_connections: int
    max_request_line_bytes: int
    max_header_bytes: int
    max_header_count: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            header_timeout_s=settings.header_timeout_s,
            max_connections=connection_cap(settings),
            max_request_line_bytes=settings.max_request_line_bytes,
            max_header_bytes=settings.max_header_bytes,
            max_header_count=settings.max_header_count,
        )

    @property
    def max_head_bytes(self) -> int:
        """What the parser may buffer for one request head: its request line and its headers."""
        return self.max_request_line_bytes + self.max_header_bytes


def connection_cap(settings: Settings) -> int:
    """Open connections allowed: the descriptor limit minus a reserve (for the model files, logs,
    threads and the listener), or ``max_connections`` when set and lower."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = max(1, soft - settings.connection_fd_reserve)
    if settings.max_connections:
        if settings.max_connections > budget:
            reserve = settings.connection_fd_reserve
            left = f"the {budget} descriptors left (RLIMIT_NOFILE {soft} − reserve {reserve})"
            log.warning("max_connections %d is above %s: using %d", settings.max_connections, left, budget)
        return min(settings.max_connections, budget)
    return budget


class _Refusal(Exception):
    """A limit crossed inside a parser callback (httptools wraps it into a parser error)."""

    def __init__(self, status: int, type_: str, message: str, limit: int | float) -> None:
        super().__init__(message)
        self.status, self.type, self.message, self.limit = status, type_, message, limit


class _HeadWithBody:
    """A response's view of the connection's transport that holds the response head (status line
    and headers: uvicorn writes them apart) until the body's first write, so that a response
    leaves in one ``send`` — one system call and one TCP segment, not two (``writelines``: a
    large body is not copied to be sent behind its head). Only a head that a
    body write will follow is held (not a HEAD's, a 204's or an empty body's); a write before
    the response starts (``100 Continue``) goes at once; ``close`` sends a held head first;
    everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._held = False  # whether this response's head has been seen

    def write(self, data: bytes) -> None:
        if self._head is not None:  # both in one send, the body not copied behind the head
            head, self._head = self._head, None
            self._transport.writelines([head, data])
            return
        if not self._held and self._cycle.response_started:
            self._held = True
            if self._body_follows():
                self._head = data
                return
        self._transport.write(data)

    def _body_follows(self) -> bool:
        cycle = self._cycle  # uvicorn has read the response's framing before writing its head
        return bool(
            cycle.scope["method"] != "HEAD" and (cycle.chunked_encoding or cycle.expected_content_length)
        )

    def close(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _extensions(scope: Any) -> dict[str, Any]:
    extensions: dict[str, Any] = scope.setdefault("extensions", {})
    return extensions


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head deadline, head budget and connection cap.

    Use ``for_limits`` to get the class to hand to ``uvicorn.Config(http=...)``.
    """

    limits: ClassVar[ConnectionLimits]
    # Connections with no request in progress, the longest waiting first: the ones to shed.
    waiting: ClassVar[OrderedDict[LimitedHttpToolsProtocol, None]]

    @classmethod
    def for_limits(cls, limits: ConnectionLimits) -> type[LimitedHttpToolsProtocol]:
        """A subclass bound to ``limits``, with its own registry (one per server)."""
        attributes = {"limits": limits, "waiting": OrderedDict()}
        return type(cls.__name__, (cls,), attributes)

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_timer: asyncio.TimerHandle | None = None
        self._reading_head = True  # the next bytes belong to a request line or headers
        self._head_bytes = 0
        self._head_begun = False  # a byte of the next request's head has been parsed
        self._header_count = 0
        self._refused = False

    # ---- connection life --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        OPEN_CONNECTIONS.inc()
        if len(self.connections) > self.limits.max_connections and not self._shed_longest_waiting():
            CONNECTIONS_CLOSED.labels(reason="over_cap").inc()
            self._refuse(
                503,
                "too_many_connections",
                f"the server holds its limit of {self.limits.max_connections} open connections, "
                "each with a request in progress; retry shortly",
                self.limits.max_connections,
                extra_headers=[(b"retry-after", b"1")],
                linger=False,  # it has sent nothing yet; its descriptor is what we need back
            )
            return
        self._wait_for_request()
        self._start_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        OPEN_CONNECTIONS.dec()
        self._stop_waiting()
        super().connection_lost(exc)
        if self.cycle is not None and not self.cycle.response_complete:
            disconnected = _extensions(self.cycle.scope).get(DISCONNECT_EXTENSION)
            if disconnected is not None and not disconnected.done():
                disconnected.set_result(None)

    def _shed_longest_waiting(self) -> bool:
        while self.waiting:
            oldest, _ = self.waiting.popitem(last=False)
            if not oldest.transport.is_closing():
                CONNECTIONS_CLOSED.labels(reason="shed").inc()
                oldest._stop_waiting()
                oldest.transport.close()
                return True
        return False

    def _wait_for_request(self) -> None:
        """No request in progress: this connection may be shed."""
        self.waiting[self] = None
        self.waiting.move_to_end(self)

    def _start_head_deadline(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _stop_waiting(self) -> None:
        self.waiting.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        CONNECTIONS_CLOSED.labels(reason="header_timeout").inc()
        if not self._head_begun:  # not a byte of a request: nobody to answer
            self._stop_waiting()
            self.transport.close()
            return
        timeout = self.limits.header_timeout_s
        self._refuse(408, "header_timeout", f"request headers not complete within {timeout:g} s", timeout)

    # ---- reading ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._unset_keepalive_if_required()
        while data:
            if self._reading_head:  # feed no more than the head budget has room for
                room = self.limits.max_head_bytes - self._head_bytes
                if room <= 0:
                    CONNECTIONS_CLOSED.labels(reason="headers_too_large").inc()
                    limit = self.limits.max_header_bytes
                    self._refuse(431, "headers_too_large", f"request headers over {limit} bytes", limit)
                    return
                chunk, data = data[:room], data[room:]
                self._head_bytes += len(chunk)
            else:
                chunk, data = data, b""
            if not self._feed(chunk):
                return

    def _feed(self, chunk: bytes) -> bool:
        try:
            self.parser.feed_data(chunk)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except _Refusal as refusal:  # raised by a callback, not wrapped (httptools < 0.7)
            self._refuse_for(refusal)
            return False
        except httptools.HttpParserError as error:
            cause = error.__cause__ or error.__context__
            if isinstance(cause, _Refusal):
                self._refuse_for(cause)
            else:
                CONNECTIONS_CLOSED.labels(reason="bad_request").inc()
                self._refuse(400, "bad_request", f"malformed HTTP request: {error}")
            return False
        return True

    def _refuse_for(self, refusal: _Refusal) -> None:
        CONNECTIONS_CLOSED.labels(reason=refusal.type).inc()
        self._refuse(refusal.status, refusal.type, refusal.message, refusal.limit)

    # Parser callbacks (run inside feed_data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions = _extensions(self.scope)
        extensions[DISCONNECT_EXTENSION] = self.loop.create_future()
        extensions[BODY_RECEIVED_EXTENSION] = self.loop.create_future()
        self._header_count = 0
        self._head_begun = True
        self._start_head_deadline()  # a request's first byte, also after a keep-alive wait

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        limit = self.limits.max_request_line_bytes
        if len(self.url) > limit:
            raise _Refusal(414, "uri_too_long", f"request target longer than {limit} bytes", limit)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        limit = self.limits.max_header_count
        if self._header_count > limit:
            raise _Refusal(431, "too_many_headers", f"more than {limit} request headers", limit)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = self._head_begun = False
        self._head_bytes = 0
        self._stop_waiting()
        super().on_headers_complete()
        if self.cycle is not None:
            # duck-typed: the cycle only writes, closes and asks is_closing
            self.cycle.transport = cast(asyncio.Transport, _HeadWithBody(self.transport, self.cycle))

    def on_message_complete(self) -> None:
        self._reading_head = True  # what comes next is the next request's head
        super().on_message_complete()
        _extensions(self.scope)[BODY_RECEIVED_EXTENSION].set_result(None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._wait_for_request()
            if not self._reading_head:  # answered before its body came: what still comes is cut
                self._start_head_deadline()

    # ---- answering --------------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """uvicorn's plain-text 400, in the service's JSON shape."""
        self._refuse(400, "bad_request", msg)

    def _refuse(
        self,
        status: int,
        type_: str,
        message: str,
        limit: int | float | None = None,
        extra_headers: list[tuple[bytes, bytes]] | None = None,
        *,
        linger: bool = True,
    ) -> None:
        """Answer ``status`` in the JSON error shape and close, unless a response is in progress
        on this connection (a pipelined request): then only close, never corrupt that response.
        Nothing more is parsed; what still arrives during the linger is dropped unread."""
        self._refused = True
        self._stop_waiting()
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        headers = self.headers if self.headers is not None else []
        request_id = request_id_from(headers)
        body = (
            ErrorResponse(error=ErrorBody(type=type_, message=message, limit=limit, request_id=request_id))
            .model_dump_json(exclude_none=True)
            .encode()
        )
        lines = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (b"x-request-id", request_id.encode()),
            *(extra_headers or []),
        ]
        head = [STATUS_LINE[status]]
        for name, value in [*self.server_state.default_headers, *lines]:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"\r\n")
        self.transport.write(b"".join([*head, body]))
        if linger and self.transport.can_write_eof():
            # Close only our side, and read (discarding) a while longer: closing a socket with
            # unread input sends a reset, and the client, still sending, would lose the answer.
            self.transport.write_eof()
            self.flow.resume_reading()
            self.loop.call_later(_LINGER_S, self.transport.close)
            self.waiting[self] = None  # and the first to go if the cap needs its descriptor
            self.waiting.move_to_end(self, last=False)
        else:
            self.transport.close()
