"""One closed-loop HTTP load generator, used identically for every system under test.

``concurrency`` clients, each with one keep-alive HTTP/1.1 connection of its own, send a request,
wait for the answer and send the next, so at most ``concurrency`` requests are in flight. The
client is a few lines over asyncio streams (uvloop when installed) rather than a full HTTP
library: it shares the cores with the server under test, and httpx cost 3–9 ms of CPU per
request at 16–64 clients here, which the server would lose. A warm-up round (one request per
client; ``warm_up=False``: none) is not counted. Then requests run for ``duration_s`` (or
``n_requests`` in all); throughput counts the items of the requests completed in the window over
the window's length, and every completed request's latency goes into the percentiles. Errors
(non-2xx, timeouts, dropped connections) are counted, never retried.

The generator runs in the benchmark process, on the same cores as the server under test: it
takes CPU from it. That cost is the same for every system, so ratios stay fair.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

BodyFactory = Callable[[int], dict[str, Any]]  # request index → JSON body


@dataclass
class LoadResult:
    concurrency: int
    items_per_request: int
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    first_error: str | None = None
    server_cpu_s: float | None = None  # the server's CPU time over the timed window, when given a clock

    @property
    def items_per_s(self) -> float:
        return self.requests * self.items_per_request / self.seconds if self.seconds else 0.0

    @property
    def server_cpu_ms_per_request(self) -> float:
        """Server CPU-milliseconds per completed request (failed ones' work included), or NaN."""
        if self.server_cpu_s is None or not self.requests:
            return float("nan")
        return 1000 * self.server_cpu_s / self.requests

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000) if self.latencies_s else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "items_per_request": self.items_per_request,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "items_per_s": self.items_per_s,
            "p50_ms": self.percentile_ms(50),
            "p90_ms": self.percentile_ms(90),
            "p99_ms": self.percentile_ms(99),
            "server_cpu_ms_per_request": self.server_cpu_ms_per_request,
            "first_error": self.first_error,
        }


class KeepAliveConnection:
    """One keep-alive HTTP/1.1 connection: POST JSON, read the answer (Content-Length or chunked).

    Also the reliability tests' client (tests/reliability/load.py): a few lines over asyncio
    streams cost the shared cores far less than a full HTTP library.
    """

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.head = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n{extra}"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """(status, lower-cased headers, body) of one POST."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(
            f"POST {path} HTTP/1.1\r\n{self.head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        await self.writer.drain()
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        if headers.get("transfer-encoding", "").lower() == "chunked":
            content = b""
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                content += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
            await self.reader.readuntil(b"\r\n")  # the empty trailer line
        else:
            content = await self.reader.readexactly(int(headers.get("content-length", 0)))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, headers, content

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):  # the peer may have closed first
                await self.writer.wait_closed()
        self.reader = self.writer = None


async def _load(
    url: str,
    body: BodyFactory,
    concurrency: int,
    items_per_request: int,
    duration_s: float | None,
    n_requests: int | None,
    timeout_s: float,
    headers: dict[str, str] | None,
    server_cpu: Callable[[], float] | None,
    warm_up: bool,
) -> LoadResult:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    result = LoadResult(concurrency, items_per_request)
    counter = iter(range(1 << 62))
    path = parts.path or "/"
    connections = [KeepAliveConnection(host, port, headers) for _ in range(concurrency)]

    async def one(conn: KeepAliveConnection, i: int) -> tuple[bool, float, str | None]:
        payload = json.dumps(body(i)).encode()
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                status, _, content = await conn.post(path, payload)
            ok = status < 300
            err = None if ok else f"{status}: {content[:200].decode(errors='replace')}"
        except (
            OSError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
        ) as e:
            await conn.close()
            ok, err = False, f"{type(e).__name__}: {e}"
        return ok, time.perf_counter() - t0, err

    try:
        if warm_up:
            await asyncio.gather(*(one(c, next(counter)) for c in connections))
        first_timed = concurrency if warm_up else 0  # the counter's next index

        cpu_at_start = server_cpu() if server_cpu else 0.0
        start = time.perf_counter()
        deadline = start + duration_s if duration_s is not None else float("inf")
        last_done = start

        async def client_loop(conn: KeepAliveConnection) -> None:
            nonlocal last_done
            while time.perf_counter() < deadline:
                i = next(counter)
                if n_requests is not None and i >= first_timed + n_requests:
                    return
                ok, latency, err = await one(conn, i)
                if ok:
                    result.requests += 1
                    result.latencies_s.append(latency)
                    last_done = time.perf_counter()
                else:
                    result.errors += 1
                    result.first_error = result.first_error or err

        await asyncio.gather(*(client_loop(c) for c in connections))
        result.seconds = last_done - start
        if server_cpu:  # every request of the window has been answered: none of its work is left out
            result.server_cpu_s = server_cpu() - cpu_at_start
    finally:
        await asyncio.gather(*(c.close() for c in connections))
    return result


def run_load(
    url: str,
    body: BodyFactory,
    *,
    concurrency: int,
    items_per_request: int = 1,
    duration_s: float | None = None,
    n_requests: int | None = None,
    timeout_s: float = 120.0,
    headers: dict[str, str] | None = None,
    server_cpu: Callable[[], float] | None = None,
    warm_up: bool = True,
) -> LoadResult:
    """Drive ``url`` with POSTs of ``body(i)`` from ``concurrency`` clients; see the module doc.
    ``warm_up=False``: no warm-up round, every request is counted (bodies 0 … n_requests−1).

    ``server_cpu``: the server's cumulative CPU seconds (``CpuMeter.cpu_seconds``), read at the
    start and the end of the timed window to fill ``LoadResult.server_cpu_s``."""
    if duration_s is None and n_requests is None:
        raise ValueError("give duration_s or n_requests")
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(
            _load(
                url,
                body,
                concurrency,
                items_per_request,
                duration_s,
                n_requests,
                timeout_s,
                headers,
                server_cpu,
                warm_up,
            )
        )


def wait_ready(url: str, timeout_s: float, is_alive: Callable[[], bool] = lambda: True) -> None:
    """Poll ``url`` (GET) until it answers 2xx; raise if ``timeout_s`` passes or the server dies."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if not is_alive():
            raise RuntimeError(f"server exited before {url} was ready ({last})")
        try:
            r = httpx.get(url, timeout=5)
            if r.status_code < 300:
                return
            last = f"{r.status_code}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s ({last})")
