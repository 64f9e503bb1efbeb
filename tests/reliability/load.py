"""A bounded closed-loop HTTP load on loopback: ``n`` requests over ``connections`` keep-alive
connections, each outcome kept (status, latency, Retry-After, or the error that lost it).

The client is the benchmarks' HTTP/1.1 connection over asyncio streams: httpx's AsyncClient
spends about 1.4 ms of CPU per request, and far more with many requests waiting on its pool,
against the server's ~1.6 ms; on two shared cores a load generator that costs more than the
server measures itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from benchmarks.loadgen import KeepAliveConnection


@dataclass(frozen=True)
class Outcome:
    status: int | None  # None: no response (``error`` says why)
    seconds: float
    started: float  # time.perf_counter() at the send
    retry_after: str | None = None
    error: str | None = None
    body: bytes = b""


Request = tuple[str, dict[str, Any]]  # path, JSON body


async def run_load(
    url: str,
    requests: Callable[[int], Request],
    n: int,
    connections: int,
    *,
    timeout_s: float = 60,
    stop: Callable[[], bool] = lambda: False,
    outcomes: list[Outcome] | None = None,
) -> list[Outcome]:
    """Send ``requests(0) .. requests(n-1)``, each connection taking the next when its last is
    answered; ``stop`` ends the run early (checked before each request). Latencies run from the
    request's first byte out to its last byte in. Outcomes are appended to ``outcomes`` (for a
    caller in another thread to watch) and returned."""
    parts = urlsplit(url)
    assert parts.hostname in ("127.0.0.1", "localhost", "::1"), "load goes to loopback only"
    host, port = parts.hostname, parts.port or 80
    outcomes = [] if outcomes is None else outcomes
    counter = iter(range(n))

    async def worker() -> None:
        connection = KeepAliveConnection(host, port)
        try:
            for i in counter:
                if stop():
                    return
                path, body = requests(i)
                start = time.perf_counter()
                try:
                    async with asyncio.timeout(timeout_s):
                        status, headers, content = await connection.post(path, json.dumps(body).encode())
                except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
                    outcomes.append(Outcome(None, time.perf_counter() - start, start, error=repr(e)))
                    await connection.close()
                    continue
                seconds = time.perf_counter() - start
                outcomes.append(Outcome(status, seconds, start, headers.get("retry-after"), body=content))
        finally:
            await connection.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return outcomes


def statuses(outcomes: list[Outcome]) -> Counter[int | None]:
    return Counter(o.status for o in outcomes)


def p99(seconds: list[float]) -> float:
    assert seconds, "no latencies to summarise"
    return float(np.percentile(seconds, 99))
