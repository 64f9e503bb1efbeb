"""One closed-loop HTTP load generator, used identically for every system under test.

``concurrency`` clients share one ``httpx.AsyncClient`` (keep-alive, one connection each); each
sends a request, waits for the answer and sends the next, so at most ``concurrency`` requests
are in flight. A warm-up round (one request per client) is not counted. Then requests run for
``duration_s`` (or ``n_requests`` in all); throughput counts the items of the requests
completed in the window over the window's length, and every completed request's latency goes
into the percentiles. Errors (non-2xx, timeouts) are counted, never retried.

The generator runs in the benchmark process, on the same cores as the server under test: it
takes CPU from it. That cost is the same for every system, so ratios stay fair.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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

    @property
    def items_per_s(self) -> float:
        return self.requests * self.items_per_request / self.seconds if self.seconds else 0.0

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
            "first_error": self.first_error,
        }


async def _load(
    url: str,
    body: BodyFactory,
    concurrency: int,
    items_per_request: int,
    duration_s: float | None,
    n_requests: int | None,
    timeout_s: float,
    headers: dict[str, str] | None,
) -> LoadResult:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    result = LoadResult(concurrency, items_per_request)
    counter = iter(range(1 << 62))

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, headers=headers) as client:

        async def one(i: int) -> tuple[bool, float, str | None]:
            t0 = time.perf_counter()
            try:
                r = await client.post(url, json=body(i))
                ok = r.status_code < 300
                err = None if ok else f"{r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as e:
                ok, err = False, f"{type(e).__name__}: {e}"
            return ok, time.perf_counter() - t0, err

        await asyncio.gather(*(one(next(counter)) for _ in range(concurrency)))  # warm-up round

        start = time.perf_counter()
        deadline = start + duration_s if duration_s is not None else float("inf")
        last_done = start

        async def client_loop() -> None:
            nonlocal last_done
            while time.perf_counter() < deadline:
                i = next(counter)
                if n_requests is not None and i >= n_requests + concurrency:
                    return
                ok, latency, err = await one(i)
                if ok:
                    result.requests += 1
                    result.latencies_s.append(latency)
                    last_done = time.perf_counter()
                else:
                    result.errors += 1
                    result.first_error = result.first_error or err

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        result.seconds = last_done - start
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
) -> LoadResult:
    """Drive ``url`` with POSTs of ``body(i)`` from ``concurrency`` clients; see the module doc."""
    if duration_s is None and n_requests is None:
        raise ValueError("give duration_s or n_requests")
    return asyncio.run(
        _load(url, body, concurrency, items_per_request, duration_s, n_requests, timeout_s, headers)
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
