"""Hostile request heads and protocol errors over real sockets (``service.__main__.serve`` over
the small engines, default limits but for shorter head and body timeouts, set as an operator
would, so that the tests waiting them out take seconds): endless and numerous headers, huge
request targets, garbage and smuggling attempts. Each gets its status in the service's JSON error
shape with an ``X-Request-ID``, the connection is closed, memory stays flat, and the server goes
on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from service.settings import Settings
from tests.reliability.hostile import LOOPBACK
from tests.servers import ServerProcess, server_process, small_server_command

MiB = 1 << 20
# Timeouts far apart, so that a head timed by the body's timeout (or the reverse) fails its test.
SETTINGS = Settings(header_timeout_s=2, body_timeout_s=5)
TIMEOUTS = {
    "TSERVE_HEADER_TIMEOUT_S": str(SETTINGS.header_timeout_s),
    "TSERVE_BODY_TIMEOUT_S": str(SETTINGS.body_timeout_s),
}


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """tests/service/run_small_server.py with the default settings but ``TIMEOUTS``."""
    log = tmp_path_factory.mktemp("small-server") / "server.log"
    with server_process(small_server_command(), TIMEOUTS, log) as server:
        yield server


def _port(server: ServerProcess) -> int:
    port = urlsplit(server.url).port
    assert port is not None
    return port


def _parse(answer: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


async def _endless_header(port: int, total_bytes: int) -> tuple[bytes, int]:
    """Stream one header value of ``total_bytes`` (or until the server stops reading); the
    server's answer and the bytes sent."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(b"GET /health/live HTTP/1.1\r\nHost: attacker\r\nX-Endless: ")
    chunk = b"a" * 65536
    sent = 0
    with contextlib.suppress(OSError):
        while sent < total_bytes and not reader.at_eof() and not writer.is_closing():
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
    answer = b""
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(10):
            answer = await reader.read()
    writer.close()
    return answer, sent


def test_endless_headers_are_431_and_memory_stays_flat(small_server: ServerProcess) -> None:
    """Three connections each streaming a 20 MiB header at once: 431 each, RSS within 64 MB."""
    process = psutil.Process(small_server.proc.pid)
    before = process.memory_info().rss
    peak = before

    async def run() -> list[tuple[bytes, int]]:
        nonlocal peak
        attacks = asyncio.gather(*(_endless_header(_port(small_server), 20 * MiB) for _ in range(3)))
        while not attacks.done():
            peak = max(peak, process.memory_info().rss)
            await asyncio.sleep(0.02)
        return await attacks

    results = asyncio.run(run())
    growth = max(peak, process.memory_info().rss) - before
    print(f"endless headers: sent {[s // 1024 for _, s in results]} KiB, RSS growth {growth / MiB:.1f} MiB")
    for answer, _ in results:
        status, headers, body = _parse(answer)
        assert status == 431
        assert body["error"]["type"] == "headers_too_large"
        assert body["error"]["limit"] == SETTINGS.max_header_bytes
        assert headers["connection"] == "close" and headers["x-request-id"]
    assert growth <= 64 * MiB
    assert httpx.get(f"{small_server.url}/health/ready").status_code == 200
    assert small_server.metric("tserve_connections_closed_total", reason="headers_too_large") >= 3


def _exchange(port: int, request: bytes) -> bytes:
    async def run() -> bytes:
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        writer.write(request)
        with contextlib.suppress(OSError):
            await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()
        writer.close()
        return answer

    return asyncio.run(run())


_HEAD = b"Host: x\r\nX-Request-ID: hostile-1\r\n"
CASES = [
    ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", 400, "bad_request", None),
    (
        "content-length-and-transfer-encoding",
        b"POST /v1/embed HTTP/1.1\r\n" + _HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\n",
        400,
        "bad_request",
        None,
    ),
    (
        "two-content-lengths",
        b"POST /v1/embed HTTP/1.1\r\n" + _HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        400,
        "bad_request",
        None,
    ),
    (
        "one-mebibyte-url",
        b"GET /health/live?" + b"q" * MiB + b" HTTP/1.1\r\n" + _HEAD + b"\r\n",
        414,
        "uri_too_long",
        SETTINGS.max_request_line_bytes,
    ),
    (
        "one-hundred-thousand-headers",
        b"GET /health/live HTTP/1.1\r\n"
        + _HEAD
        + b"".join(b"X-%d: 1\r\n" % i for i in range(100_000))
        + b"\r\n",
        431,
        "too_many_headers",
        SETTINGS.max_header_count,
    ),
    (
        "sixteen-mebibyte-header",
        b"GET /health/live HTTP/1.1\r\n" + _HEAD + b"X-Big: " + b"b" * (16 * MiB) + b"\r\n\r\n",
        431,
        "headers_too_large",
        SETTINGS.max_header_bytes,
    ),
]


@pytest.mark.parametrize(
    ("request_bytes", "status", "type_", "limit"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_protocol_errors_are_json_with_a_request_id_and_close(
    small_server: ServerProcess, request_bytes: bytes, status: int, type_: str, limit: int | None
) -> None:
    got, headers, body = _parse(_exchange(_port(small_server), request_bytes))
    assert got == status
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert body["error"]["type"] == type_
    assert body["error"].get("limit") == limit
    # the client's id when the server got as far as reading it, else a new one; always in both places
    assert headers["x-request-id"] == body["error"]["request_id"]
    if type_ in ("too_many_headers", "bad_request") and request_bytes.startswith(b"POST"):
        assert headers["x-request-id"] == "hostile-1"


def test_a_slow_head_is_408_in_the_json_shape(small_server: ServerProcess) -> None:
    """The header timeout: a head still incomplete after it is answered 408 and closed."""

    async def run() -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection(LOOPBACK, _port(small_server))
        writer.write(b"GET /health/live HTTP/1.1\r\nX-Request-ID: slow-1\r\nHost: x\r\n")
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with asyncio.timeout(SETTINGS.header_timeout_s + 5):
            answer = await reader.read()
        writer.close()
        return answer, loop.time() - start

    answer, seconds = asyncio.run(run())
    status, headers, body = _parse(answer)
    assert status == 408 and body["error"]["type"] == "header_timeout"
    assert body["error"]["limit"] == SETTINGS.header_timeout_s
    assert headers["x-request-id"] == "slow-1" and headers["connection"] == "close"
    assert SETTINGS.header_timeout_s - 0.5 <= seconds <= SETTINGS.header_timeout_s + 2


def test_a_body_shorter_than_declared_is_408_in_the_json_shape(small_server: ServerProcess) -> None:
    """Content-Length 1000 and 13 bytes sent: answered 408 after the body timeout, not waited for."""
    request = (
        b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'X-Request-ID: short-1\r\nContent-Length: 1000\r\n\r\n{"texts": ["a'
    )

    async def run() -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection(LOOPBACK, _port(small_server))
        writer.write(request)
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with asyncio.timeout(SETTINGS.body_timeout_s + 5):
            answer = await reader.read()
        writer.close()
        return answer, loop.time() - start

    answer, seconds = asyncio.run(run())
    status, headers, body = _parse(answer)
    assert status == 408 and body["error"]["type"] == "body_timeout"
    assert body["error"]["limit"] == SETTINGS.body_timeout_s
    assert headers["x-request-id"] == "short-1" and headers["connection"] == "close"
    assert SETTINGS.body_timeout_s - 0.5 <= seconds <= SETTINGS.body_timeout_s + 2


def test_a_body_nobody_reads_cannot_hold_the_connection_after_its_response(
    small_server: ServerProcess,
) -> None:
    """GET /health/live declaring a 1000-byte body and trickling it: answered at once (the route
    reads no body), then the connection is closed once the header timeout passes, however
    steadily the client keeps sending."""

    async def run() -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection(LOOPBACK, _port(small_server))
        writer.write(b"GET /health/live HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
        answer = await reader.readuntil(b"}")
        loop = asyncio.get_running_loop()
        start = loop.time()
        with contextlib.suppress(OSError):
            while not reader.at_eof() and loop.time() - start < SETTINGS.header_timeout_s + 5:
                writer.write(b"x")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await reader.read(1)
        writer.close()
        return answer, loop.time() - start

    answer, seconds = asyncio.run(run())
    assert answer.startswith(b"HTTP/1.1 200")
    assert seconds <= SETTINGS.header_timeout_s + 1


def test_the_server_still_serves_after_the_hostile_heads(small_server: ServerProcess) -> None:
    r = httpx.post(f"{small_server.url}/v1/embed", json={"texts": ["still here"]})
    assert r.status_code == 200
