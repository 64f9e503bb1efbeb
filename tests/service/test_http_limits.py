"""The server's protocol writes each response in one piece: head and body together, a head
alone only where no body follows (HEAD, 204), and ``100 Continue`` at once, before the body.
Its clocks: a keep-alive connection idles up to the keep-alive timeout, the head deadline
counts from a connection's opening or from its next request's first byte."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from service.api.extensions import BODY_RECEIVED_EXTENSION
from service.http.limits import ConnectionLimits, LimitedHttpToolsProtocol

pytestmark = pytest.mark.anyio

LIMITS = ConnectionLimits(
    header_timeout_s=5,
    max_connections=16,
    max_request_line_bytes=1024,
    max_header_bytes=4096,
    max_header_count=32,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Echoes the request body; ``/empty`` answers 204; ``/arrived`` whether the body-received
    signal was done when the app started and once it had read the body."""
    if scope["type"] != "http":
        return
    arrived = scope["extensions"][BODY_RECEIVED_EXTENSION]
    at_start = arrived.done()
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    status, content = (204, b"") if scope["path"] == "/empty" else (200, b"echo:" + body)
    if scope["path"] == "/arrived":
        content = f"arrived: {at_start} {arrived.done()}".encode()
    headers = [(b"content-length", str(len(content)).encode())] if status == 200 else []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A uvicorn server with the limited protocol on a free port, and every send its
    connections' transports make (the asyncio transport's own ``write`` and ``writelines``,
    each recorded as one)."""
    writes: list[bytes] = []
    transport_type: Any = type(await _a_transport())
    real_write = transport_type.write

    def recording_write(self: Any, data: bytes) -> None:
        writes.append(bytes(data))
        real_write(self, data)

    def recording_writelines(self: Any, parts: list[bytes]) -> None:
        recording_write(self, b"".join(parts))  # one send either way

    monkeypatch.setattr(transport_type, "write", recording_write)
    monkeypatch.setattr(transport_type, "writelines", recording_writelines)
    async with serving(LIMITS) as port:
        yield port, writes


@contextlib.asynccontextmanager
async def serving(limits: ConnectionLimits, keep_alive_s: int = 5) -> AsyncIterator[int]:
    """A uvicorn server with the limited protocol on a free port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="asyncio",
        http=LimitedHttpToolsProtocol.for_limits(limits),
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=keep_alive_s,
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


async def _a_transport() -> asyncio.Transport:
    """A connected asyncio socket transport, only to learn its class."""
    left, right = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, left)
    transport.close()
    right.close()
    return transport  # type: ignore[return-value]


async def exchange(port: int, request: bytes, *, then: bytes = b"", until: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    got = b""
    if then:  # send the body only once the interim answer is in
        got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(then)
    while until not in got:
        got += await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    return got


def responses(writes: list[bytes]) -> list[bytes]:
    return [w for w in writes if w.startswith(b"HTTP/1.1 ")]


async def test_a_response_is_one_write_head_and_body(server: tuple[int, list[bytes]]) -> None:
    port, writes = server
    request = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"
    got = await exchange(port, request, until=b"echo:hi")
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"\r\n\r\necho:hi")
    assert responses(writes) == [got]  # the whole response in one write


async def test_head_and_204_answers_still_leave_and_keep_the_connection(
    server: tuple[int, list[bytes]],
) -> None:
    port, writes = server
    both = b"HEAD /x HTTP/1.1\r\nHost: t\r\n\r\nGET /empty HTTP/1.1\r\nHost: t\r\n\r\n"
    got = await exchange(port, both, until=b"HTTP/1.1 204")
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and b"echo" not in got
    assert len(responses(writes)) == 2


async def test_100_continue_goes_before_the_body_is_sent(server: tuple[int, list[bytes]]) -> None:
    port, writes = server
    head = b"POST /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    got = await exchange(port, head, then=b"ok", until=b"echo:ok")
    assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert [w[:12] for w in responses(writes)] == [b"HTTP/1.1 100", b"HTTP/1.1 200"]


async def test_the_body_received_signal_is_done_once_the_whole_body_is_in(
    server: tuple[int, list[bytes]],
) -> None:
    port, _ = server
    whole = b"POST /arrived HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"
    assert (await exchange(port, whole, until=b"arrived: ")).endswith(b"arrived: True True")
    head = b"POST /arrived HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    later = await exchange(port, head, then=b"ok", until=b"arrived: ")  # the body after 100 Continue
    assert later.endswith(b"arrived: False True")


QUICK_HEAD = dataclasses.replace(LIMITS, header_timeout_s=0.5)
GET = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await asyncio.wait_for(reader.readexactly(length), 5)


async def _closed_after(reader: asyncio.StreamReader) -> float:
    """Seconds until the server closes the connection (EOF or reset), reading what it sends."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    with contextlib.suppress(ConnectionError):
        while await asyncio.wait_for(reader.read(65536), 10):
            pass
    return loop.time() - start


async def test_a_keep_alive_connection_idle_past_the_head_deadline_is_still_served() -> None:
    """Idle between requests is the keep-alive timeout's business, not the head deadline's: a
    client's next request on a connection idle longer than the head deadline is answered."""
    async with serving(QUICK_HEAD, keep_alive_s=5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(1.2)
        writer.write(GET)
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        writer.close()


async def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout() -> None:
    async with serving(QUICK_HEAD, keep_alive_s=1) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        assert 0.8 <= await _closed_after(reader) <= 2.5
        writer.close()


async def test_the_head_deadline_runs_from_the_next_requests_first_byte() -> None:
    """After a keep-alive wait longer than the head deadline, a head begun and left incomplete
    gets 408 one head deadline later, not at once."""
    async with serving(QUICK_HEAD, keep_alive_s=5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(1.2)
        writer.write(b"GET /x HTTP/1.1\r\nHost:")
        loop = asyncio.get_running_loop()
        start = loop.time()
        answer = await _answer(reader)
        assert answer.startswith(b"HTTP/1.1 408") and b"header_timeout" in answer
        assert 0.4 <= loop.time() - start <= 1.5
        writer.close()


async def test_a_connection_that_sends_nothing_is_closed_after_the_head_deadline() -> None:
    async with serving(QUICK_HEAD, keep_alive_s=5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert 0.4 <= await _closed_after(reader) <= 1.5
        writer.close()


async def test_a_pipelined_head_left_incomplete_gets_408_after_the_head_deadline() -> None:
    """A request and the beginning of the next in one write: the first is answered, the second
    head, begun already, has the head deadline to complete, not the keep-alive timeout."""
    async with serving(QUICK_HEAD, keep_alive_s=5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET + b"GET /x HTTP/1.1\r\nHost:")
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        loop = asyncio.get_running_loop()
        start = loop.time()
        answer = await _answer(reader)
        assert answer.startswith(b"HTTP/1.1 408") and loop.time() - start <= 1.5
        writer.close()
