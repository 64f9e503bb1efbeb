"""Hostile connections against a real server (``service.__main__.serve`` over the small engines):
slow headers, idle sockets beyond the connection cap, and a stalled client at shutdown.

The attack runs in a process of its own (tests/reliability/hostile.py); this process meanwhile
times normal requests and readiness probes, and watches the server's memory (psutil).
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import psutil
import pytest

from benchmarks.loadgen import KeepAliveConnection
from service.settings import Settings
from tests.reliability.hostile import get_status
from tests.servers import ROOT, ServerProcess, server_process, small_server_command

MiB = 1 << 20


def _port(server: ServerProcess) -> int:
    port = urlsplit(server.url).port
    assert port is not None
    return port


async def _attack(port: int, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.reliability.hostile", *args, "--port", str(port),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _probe_while(
    attacker: asyncio.subprocess.Process, port: int, at_least_s: float = 0.0
) -> tuple[list[float], list[int | None]]:
    """Until the attacker exits (and for ``at_least_s``): one-sentence embeddings on a keep-alive
    connection (latencies) and readiness probes on fresh connections every 0.25 s (statuses)."""
    latencies: list[float] = []
    readiness: list[int | None] = []
    body = json.dumps({"texts": ["A man is eating food."]}).encode()
    until = time.monotonic() + at_least_s

    def attacking() -> bool:
        return attacker.returncode is None or time.monotonic() < until

    async def embed_loop() -> None:
        connection = KeepAliveConnection("127.0.0.1", port)
        try:
            while attacking():
                start = time.perf_counter()
                status, _, _ = await connection.post("/v1/embed", body)
                latencies.append(time.perf_counter() - start)
                assert status == 200
                await asyncio.sleep(0.02)
        finally:
            await connection.close()

    async def readiness_loop() -> None:
        while attacking():
            readiness.append(await get_status(port, "/health/ready"))
            await asyncio.sleep(0.25)

    waiter = asyncio.ensure_future(attacker.wait())
    await asyncio.gather(embed_loop(), readiness_loop(), waiter)
    return latencies, readiness


def _slow_headers(
    tmp_path: Path, connections: int, header_timeout_s: float | None, interval_s: float, run_s: float
) -> tuple[dict[str, Any], list[float], list[int | None], int]:
    env = {} if header_timeout_s is None else {"TSERVE_HEADER_TIMEOUT_S": str(header_timeout_s)}
    with server_process(small_server_command(), env, tmp_path / "server.log") as server:
        rss_before = server.rss_bytes()
        port = _port(server)

        async def run() -> tuple[dict[str, Any], list[float], list[int | None]]:
            attacker = await _attack(
                port, "slow-headers", "--connections", str(connections),
                "--interval-s", str(interval_s), "--seconds", str(run_s),
            )  # fmt: skip
            await asyncio.sleep(1.0)  # the connections are open before the probing starts
            latencies, readiness = await _probe_while(attacker, port, at_least_s=run_s)
            assert attacker.stdout is not None
            return json.loads(await attacker.stdout.read()), latencies, readiness

        report, latencies, readiness = asyncio.run(run())
        growth = server.rss_bytes() - rss_before
        assert server.proc.poll() is None
    return report, latencies, readiness, growth


def _check_slow_headers(
    report: dict[str, Any],
    latencies: list[float],
    readiness: list[int | None],
    growth: int,
    connections: int,
    within_s: float,
) -> None:
    closed = [c for c in report["connections"] if c["closed_after_s"] is not None]
    in_time = [c for c in closed if c["closed_after_s"] <= within_s]
    p99_ms = float(np.percentile(latencies, 99) * 1000)
    print(
        f"{connections} slow-header connections: {len(in_time)} closed by the server within {within_s:g} s "
        f"({len(closed)} in all, statuses {sorted({c['status'] for c in closed}, key=str)}); "
        f"{len(latencies)} embeddings meanwhile, p99 {p99_ms:.0f} ms; readiness {readiness.count(200)}/"
        f"{len(readiness)} × 200; RSS growth {growth / MiB:.1f} MiB"
    )
    assert len(in_time) >= 0.9 * connections
    assert {c["status"] for c in closed} <= {408, None}  # 408, or closed before it could be read
    assert latencies and p99_ms <= 250
    assert readiness and all(status == 200 for status in readiness)
    assert growth <= 64 * MiB


def test_slow_header_connections_are_closed_while_the_service_answers(tmp_path: Path) -> None:
    """1,500 connections sending a header line a second, a 2 s header timeout (CI size)."""
    report, latencies, readiness, growth = _slow_headers(tmp_path, 1500, 2.0, 1.0, 6.0)
    _check_slow_headers(report, latencies, readiness, growth, 1500, within_s=5.0)


@pytest.mark.long
def test_slow_header_connections_long(tmp_path: Path) -> None:
    """The issue's attack with the default 10 s header timeout: a header line every 10 s."""
    report, latencies, readiness, growth = _slow_headers(tmp_path, 1500, None, 10.0, 40.0)
    _check_slow_headers(report, latencies, readiness, growth, 1500, within_s=30.0)


def _beyond_the_cap(
    tmp_path: Path, cap: int | None, attackers: int, per_attacker: int, hold_s: float
) -> None:
    """Idle connections beyond the cap (no header timeout to save the day): the oldest idle ones
    are shed, readiness and normal requests still answer, descriptors stay bounded. ``cap``
    None: the default, from the server's RLIMIT_NOFILE (inherited from this process)."""
    env = {"TSERVE_HEADER_TIMEOUT_S": "600"}
    if cap is None:
        cap = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - Settings().connection_fd_reserve
    else:
        env["TSERVE_MAX_CONNECTIONS"] = str(cap)
    with server_process(small_server_command(), env, tmp_path / "server.log") as server:
        port = _port(server)
        process = psutil.Process(server.proc.pid)
        fds_before = process.num_fds()

        async def run() -> tuple[list[dict[str, Any]], list[float], list[int | None], int]:
            procs = [
                await _attack(port, "idle", "--connections", str(per_attacker), "--seconds", str(hold_s))
                for _ in range(attackers)
            ]
            peak_fds = 0

            async def watch_fds() -> None:
                nonlocal peak_fds
                while any(p.returncode is None for p in procs):
                    peak_fds = max(peak_fds, process.num_fds())
                    await asyncio.sleep(0.2)

            await asyncio.sleep(0.5)
            watcher = asyncio.ensure_future(watch_fds())
            latencies, readiness = await _probe_while(procs[-1], port)
            reports = []
            for p in procs:
                assert p.stdout is not None
                reports.append(json.loads(await p.stdout.read()))
                await p.wait()
            await watcher
            return reports, latencies, readiness, peak_fds

        reports, latencies, readiness, peak_fds = asyncio.run(run())
        opened = sum(r["opened"] for r in reports)
        shed = sum(r["closed_by_server"] for r in reports)
        print(
            f"{opened} idle connections against a cap of {cap}: {shed} shed by the server; descriptors "
            f"{fds_before} → peak {peak_fds}; readiness {readiness.count(200)}/{len(readiness)} × 200; "
            f"embedding p99 {np.percentile(latencies, 99) * 1000:.0f} ms"
        )
        assert opened == attackers * per_attacker
        assert shed >= opened - cap
        assert peak_fds <= fds_before + cap + 16  # + the probes' own connections
        assert peak_fds < resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # never out of descriptors
        assert readiness and all(status == 200 for status in readiness)
        assert server.metric("tserve_connections_closed_total", reason="shed") >= opened - cap


def test_idle_connections_beyond_the_cap_are_shed_and_probes_still_answer(tmp_path: Path) -> None:
    _beyond_the_cap(tmp_path, cap=200, attackers=1, per_attacker=600, hold_s=4.0)


@pytest.mark.long
def test_twenty_thousand_idle_connections_long(tmp_path: Path) -> None:
    """20,000 connections (two attacker processes, each within its own descriptor limit) against
    the default cap: readiness still answers. Needs RLIMIT_NOFILE ≥ 10,100 here."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < 10_100:
        pytest.skip(f"RLIMIT_NOFILE {soft}: an attacker process cannot open 10,000 connections")
    _beyond_the_cap(tmp_path, cap=None, attackers=2, per_attacker=10_000, hold_s=20.0)


def test_a_stalled_client_cannot_hold_shutdown_past_the_grace(tmp_path: Path) -> None:
    """SIGTERM with a client stalled mid-headers and one stalled mid-body (timeouts far longer
    than the grace): readiness turns 503 during the drain delay, and the process exits 0
    within drain delay + grace."""
    env = {
        "TSERVE_DRAIN_DELAY_S": "1",
        "TSERVE_SHUTDOWN_GRACE_S": "2",
        "TSERVE_HEADER_TIMEOUT_S": "600",
        "TSERVE_BODY_TIMEOUT_S": "600",
    }
    with server_process(small_server_command(), env, tmp_path / "server.log") as server:
        port = _port(server)

        async def run() -> tuple[int | None, float]:
            _, mid_head = await asyncio.open_connection("127.0.0.1", port)
            mid_head.write(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")
            _, mid_body = await asyncio.open_connection("127.0.0.1", port)
            mid_body.write(
                b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"texts": ["stalled'
            )
            await asyncio.sleep(0.5)
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            during_drain = await get_status(port, "/health/ready")
            while server.proc.poll() is None and time.monotonic() - signalled < 30:
                await asyncio.sleep(0.05)
            return during_drain, time.monotonic() - signalled

        during_drain, exit_after_s = asyncio.run(run())
        code = server.proc.returncode
        print(f"readiness during the drain: {during_drain}; exit {code} after {exit_after_s:.2f} s")
        assert during_drain == 503
        assert code == 0
        assert exit_after_s <= 1 + 2 + 2.5  # drain + grace + teardown


def test_the_default_drain_delay_answers_503_before_the_listener_closes(tmp_path: Path) -> None:
    """With the default drain delay (that of the Kubernetes readiness probe: k8s/base) a SIGTERM
    turns readiness and new requests to 503 while the listener stays open, instead of refusing
    connections at once."""
    default = Settings.model_fields["drain_delay_s"].default
    assert default >= 10
    env = {"TSERVE_DRAIN_DELAY_S": str(default)}  # tests/servers.py sets 0 for the other tests
    with server_process(small_server_command(), env, tmp_path / "server.log") as server:
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        readiness = httpx.get(f"{server.url}/health/ready", timeout=5)
        embed = httpx.post(f"{server.url}/v1/embed", json={"texts": ["a"]}, timeout=5)
        assert readiness.status_code == 503
        assert embed.status_code == 503 and embed.json()["error"]["type"] == "shutting_down"
        server.proc.send_signal(signal.SIGTERM)  # a second signal ends the drain at once
        assert server.proc.wait(10) == 0
