"""Translation over HTTP under mixed traffic: iteration-level ("continuous") vs whole-batch decoding.

The same server (``python -m service``, the default int8 translator) is started with
``TSERVE_TRANSLATE_BATCHING=batch`` and ``=continuous``, and driven the same way:

* **mixed**: 16 clients for a fixed time (each on one keep-alive connection, opened by an uncounted
  request before it), each request beam 4; 80 % are one short caption (a Multi30k test
  sentence), 20 % long inputs (half a paragraph of five captions, half one sentence of 40+
  tokens: three captions joined by ", and"). Reported: p50/p99 latency of the
  short requests, and output tokens per second (the server's own ``tserve_output_tokens`` counter).
* **uniform**: 16 clients sending one short caption each, for half the time: requests per second.
* **hostile** (continuous only): 8 clients each sending 64 texts of ~600 characters with beam 8,
  n-best 8 and max_length 128, twice (issue 17's max_length 512 is now refused at once: over the
  model's 256, and over the per-request decode cost cap), while a prober sends a one-word request
  every 0.2 s and the server's resident memory is sampled. Reported: peak RSS against the budget,
  the one-word p99 during and after, and every status code seen (504 for requests whose own
  deadline passed is the only 5xx allowed).

Each mode runs ``--rounds`` times (2 in quick mode), the order alternating, a fresh server each
time; the rounds' latencies, tokens and requests are pooled per mode (the short requests' p99 of
whole-batch decoding moved by 2× between single runs), and each round's p99 is reported too.

Run: ``python -m benchmarks --data-dir path/to/data --only mixed_traffic`` (a stage).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from benchmarks.common import RssPeak, rss_mb
from benchmarks.harness import Bench, Need, Stage
from benchmarks.loadgen import KeepAliveConnection
from benchmarks.results import Figure as F
from benchmarks.results import Results, Row

SECTION_SHORT_P99 = "mixed traffic: short-request p99 latency (ms), 16 clients, 20 % long inputs, beam 4"
SECTION_SHORT_P50 = "mixed traffic: short-request p50 latency (ms), 16 clients, 20 % long inputs, beam 4"
SECTION_TOKENS = "mixed traffic: output tokens/s, 16 clients, 20 % long inputs, beam 4"
SECTION_UNIFORM = "uniform traffic: one-caption requests/s, 16 clients, beam 4"
SECTION_HOSTILE = "hostile load (8 × 64 texts of 600 chars, beam 8, n-best 8): one-word p99 (ms)"
MODES = ("batch", "continuous")


@dataclass
class Mix:
    short_latencies_s: list[float] = field(default_factory=list)
    long_latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0


def output_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(r"^tserve_output_tokens_total\{[^}]*\} (\S+)$", text, re.M))


async def drive(
    url: str, pool: list[str], clients: int, duration_s: float, long_share: float, seed: int
) -> Mix:
    """``clients`` closed-loop clients for ``duration_s``; ``long_share`` of requests long.

    Each client holds one keep-alive connection (``loadgen.KeepAliveConnection``, as the load
    generator's: httpx's CPU a request would come off the server's shared cores), opened by one
    request before the window, not counted (the load generator's warm-up round): counted, that
    first wave measured the clients' own setup (a run's 8 slowest short requests all started in
    its first half second, in both modes)."""
    parts = urlsplit(url)
    connections = [
        KeepAliveConnection(parts.hostname or "127.0.0.1", parts.port or 80) for _ in range(clients)
    ]
    mix = Mix()

    async def translate(conn: KeepAliveConnection, text: str) -> int:
        async with asyncio.timeout(120):
            status, _, _ = await conn.post(
                "/v1/translate", json.dumps({"text": text, "beam_size": 4}).encode()
            )
        return status

    async def client(i: int, conn: KeepAliveConnection) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.perf_counter() < end:
            long = rng.random() < long_share
            if not long:
                text = rng.choice(pool)
            elif rng.random() < 0.5:
                text = " ".join(rng.sample(pool, 5))  # a paragraph: five sentences
            else:
                text = ", and ".join(s.rstrip(".") for s in rng.sample(pool, 3)) + "."  # 40+ tokens
            t0 = time.perf_counter()
            status = await translate(conn, text)
            (mix.long_latencies_s if long else mix.short_latencies_s).append(time.perf_counter() - t0)
            mix.statuses[status] += 1

    try:
        await asyncio.gather(*(translate(conn, pool[i % len(pool)]) for i, conn in enumerate(connections)))
        t0 = time.perf_counter()
        end = t0 + duration_s
        await asyncio.gather(*(client(i, conn) for i, conn in enumerate(connections)))
        mix.seconds = time.perf_counter() - t0
    finally:
        await asyncio.gather(*(conn.close() for conn in connections))
    return mix


@dataclass
class Hostile:
    rss_before_mb: float
    rss_peak_mb: float = 0.0
    rss_after_mb: float = 0.0
    during_s: list[float] = field(default_factory=list)
    after_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    probe_statuses: Counter[int] = field(default_factory=Counter)


async def hostile(url: str, pool: list[str], pid: int, after_s: float = 5.0) -> Hostile:
    """The worst-case load of issue 17 with a one-word prober, sampling the server's RSS."""
    rng = random.Random(7)
    out = Hostile(rss_before_mb=rss_mb(pid))
    peak = RssPeak(pid)

    def text() -> str:
        words = " ".join(rng.sample(pool, 12))
        return words[:600]

    async def worst(http: httpx.AsyncClient) -> None:
        for _ in range(2):
            body = {"text": [text() for _ in range(64)], "beam_size": 8, "n_best": 8, "max_length": 128}
            r = await http.post("/v1/translate", json=body)
            out.statuses[r.status_code] += 1

    async def probe(http: httpx.AsyncClient, sink: list[float], until: asyncio.Task[Any] | float) -> None:
        while (not until.done()) if isinstance(until, asyncio.Task) else time.perf_counter() < until:
            t0 = time.perf_counter()
            r = await http.post("/v1/translate", json={"text": "Hello"})
            sink.append(time.perf_counter() - t0)
            out.probe_statuses[r.status_code] += 1
            await asyncio.sleep(0.2)

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=32)) as http:

        async def load_all() -> None:
            await asyncio.gather(*(worst(http) for _ in range(8)))

        load = asyncio.create_task(load_all())
        await probe(http, out.during_s, load)
        await load
        await probe(http, out.after_s, time.perf_counter() + after_s)
    out.rss_peak_mb = peak.stop()
    out.rss_after_mb = rss_mb(pid)
    return out


def ms(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q) * 1000) if xs else float("nan")


def run(bench: Bench) -> None:
    """Both modes under mixed and uniform traffic, in ``bench.rounds`` rounds that alternate the
    modes' order (batch, continuous; continuous, batch; …) on a fresh server each, so a slow
    period of the shared machine weighs on both alike; the rounds' samples are pooled per mode.
    The hostile load runs once, on continuous decoding."""
    pool = bench.test_set(1000)[0]
    pooled = {mode: Pooled() for mode in MODES}
    loaded: Hostile | None = None
    for r in range(bench.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            env = {"TSERVE_TRANSLATE_BATCHING": mode, "TSERVE_REQUEST_TIMEOUT_S": "30"}
            service = bench.start_service(env, f" ({mode} decoding, round {r + 1} of {bench.rounds})")
            if service is None:
                return
            try:
                pooled[mode].add(measure_round(service.base, pool, bench.duration, seed=r))
                if mode == "continuous" and loaded is None:
                    loaded = asyncio.run(hostile(service.base, pool, service.pid))
            finally:
                service.stop()
    for mode in MODES:
        report(bench.results, mode, pooled[mode])
    if loaded is not None:
        report_hostile(bench.results, loaded)


@dataclass
class Round:
    mixed: Mix
    tokens: float  # output tokens the server counted during the mixed load
    uniform: Mix


@dataclass
class Pooled:
    """One mode's rounds, samples pooled."""

    mixed: Mix = field(default_factory=Mix)
    tokens: float = 0.0
    uniform: Mix = field(default_factory=Mix)
    round_p99_ms: list[float] = field(default_factory=list)

    def add(self, one: Round) -> None:
        for into, part in ((self.mixed, one.mixed), (self.uniform, one.uniform)):
            into.short_latencies_s += part.short_latencies_s
            into.long_latencies_s += part.long_latencies_s
            into.statuses.update(part.statuses)
            into.seconds += part.seconds
        self.tokens += one.tokens
        self.round_p99_ms.append(round(ms(one.mixed.short_latencies_s, 99), 1))


def measure_round(url: str, pool: list[str], duration_s: float, seed: int) -> Round:
    """One server's mixed then uniform load; ``seed`` picks the round's request sequence (the
    same for both modes in a round)."""
    asyncio.run(drive(url, pool, 4, 3.0, 0.2, seed=0))  # warm-up
    before = output_tokens(url)
    mixed = asyncio.run(drive(url, pool, 16, duration_s, 0.2, seed=1 + 10 * seed))
    tokens = output_tokens(url) - before
    uniform = asyncio.run(drive(url, pool, 16, duration_s / 2, 0.0, seed=2 + 10 * seed))
    return Round(mixed, tokens, uniform)


FIGURES = {  # mode → (short p99, tokens/s, uniform requests/s)
    "continuous": (F.MIXED_SHORT_P99_CONTINUOUS, F.MIXED_TOKENS_CONTINUOUS, F.UNIFORM_CONTINUOUS),
    "batch": (F.MIXED_SHORT_P99_BATCH, F.MIXED_TOKENS_BATCH, F.UNIFORM_BATCH),
}


def report(results: Results, mode: str, p: Pooled) -> None:
    baseline = mode == "batch"
    p99_figure, tokens_figure, uniform_figure = FIGURES[mode]
    mix = p.mixed
    extra = {
        "requests": sum(mix.statuses.values()),
        "statuses": dict(mix.statuses),
        "rounds_p99_ms": p.round_p99_ms,
    }
    p99 = ms(mix.short_latencies_s, 99)
    results.add(Row(SECTION_SHORT_P99, mode, p99, "ms", baseline, False, extra, figure=p99_figure))
    results.add(Row(SECTION_SHORT_P50, mode, ms(mix.short_latencies_s, 50), "ms", baseline, False))
    long_p50 = {"long_p50_ms": ms(mix.long_latencies_s, 50)}
    tokens = p.tokens / mix.seconds
    results.add(Row(SECTION_TOKENS, mode, tokens, "tok/s", baseline, True, long_p50, figure=tokens_figure))
    rate = sum(p.uniform.statuses.values()) / p.uniform.seconds
    extra = {
        "p50_ms": ms(p.uniform.short_latencies_s, 50),
        "p99_ms": ms(p.uniform.short_latencies_s, 99),
        "statuses": dict(p.uniform.statuses),
    }
    results.add(Row(SECTION_UNIFORM, mode, rate, "req/s", baseline, True, extra, figure=uniform_figure))


def report_hostile(results: Results, h: Hostile) -> None:
    extra = {
        "after_p99_ms": ms(h.after_s, 99),
        "rss_before_mb": h.rss_before_mb,
        "rss_peak_mb": h.rss_peak_mb,
        "rss_after_mb": h.rss_after_mb,
        "statuses": dict(h.statuses),
        "probe_statuses": dict(h.probe_statuses),
    }
    during = ms(h.during_s, 99)
    figure = F.HOSTILE_ONE_WORD_P99
    results.add(
        Row(SECTION_HOSTILE, "continuous: during the load", during, "ms", True, False, extra, figure=figure)
    )


STAGE = Stage(
    "mixed_traffic",
    "mixed traffic: continuous vs whole-batch decoding over HTTP",
    frozenset({Need.OUR_CHECKPOINT, Need.EMBEDDING}),
    run,
)
