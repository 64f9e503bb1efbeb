"""Hostile clients for tests/reliability/test_hostile_*.py, on loopback only.

Run as a process of its own (``python -m tests.reliability.hostile ...``), so that many
connections take the attacker's descriptors, not the test's, and the test's event loop stays
free to time the normal requests it sends meanwhile. It prints one JSON object.

- ``slow-headers``: N connections each send a request line, then one header line every
  ``interval`` seconds, never finishing the head; reports, for each, when the server closed it
  (seconds after it opened) and the status it answered with, if any.
- ``idle``: N connections opened one after the other that send nothing; reports how many the
  server closed before the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

LOOPBACK = "127.0.0.1"


def _status(answer: bytes) -> int | None:
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else None


async def get_status(port: int, path: str, timeout_s: float = 5.0) -> int | None:
    """One GET on a fresh connection, as a kubelet probe does: the status, or None without one."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(LOOPBACK, port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode())
            answer = await reader.read()
            writer.close()
    except (OSError, TimeoutError):
        return None
    return _status(answer)


async def _slow_header_connection(port: int, interval_s: float, run_s: float) -> dict[str, Any]:
    opened = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
    except OSError as e:
        return {"closed_after_s": 0.0, "status": None, "error": f"connect: {e!r}"}
    writer.write(b"GET /health/live HTTP/1.1\r\nHost: attacker\r\n")
    answer = b""
    header = 0
    try:
        while time.monotonic() - opened < run_s:
            try:
                async with asyncio.timeout(interval_s):
                    chunk = await reader.read(4096)
            except TimeoutError:
                header += 1
                writer.write(b"X-Slow-%d: still sending\r\n" % header)
                continue
            if not chunk:  # the server closed the connection
                return {"closed_after_s": time.monotonic() - opened, "status": _status(answer)}
            answer += chunk
    except OSError:  # reset by the server
        return {"closed_after_s": time.monotonic() - opened, "status": _status(answer)}
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return {"closed_after_s": None, "status": _status(answer)}


async def slow_headers(port: int, connections: int, interval_s: float, run_s: float) -> dict[str, Any]:
    results = await asyncio.gather(
        *(_slow_header_connection(port, interval_s, run_s) for _ in range(connections))
    )
    return {"connections": results}


async def idle(port: int, connections: int, hold_s: float) -> dict[str, Any]:
    """Open ``connections`` silent connections one by one, hold them ``hold_s``, count the closed."""
    sockets: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    refused = 0
    for _ in range(connections):
        try:
            sockets.append(await asyncio.open_connection(LOOPBACK, port))
        except OSError:
            refused += 1
    await asyncio.sleep(hold_s)
    closed = 0
    for reader, writer in sockets:
        if reader.at_eof() or writer.is_closing():
            closed += 1
        else:
            with contextlib.suppress(TimeoutError, OSError):
                async with asyncio.timeout(0.001):
                    if not await reader.read(4096):
                        closed += 1
        writer.close()
    return {"opened": len(sockets), "refused": refused, "closed_by_server": closed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("attack", choices=["slow-headers", "idle"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--interval-s", type=float, default=10.0, help="slow-headers: between header lines")
    parser.add_argument("--seconds", type=float, required=True, help="how long the attack lasts at most")
    args = parser.parse_args(argv)
    if args.attack == "slow-headers":
        result = asyncio.run(slow_headers(args.port, args.connections, args.interval_s, args.seconds))
    else:
        result = asyncio.run(idle(args.port, args.connections, args.seconds))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
