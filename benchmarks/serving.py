"""Our service as a subprocess, and the serving-efficiency comparisons.

* dynamic batching vs batch-size-1 serial (the same service with ``TSERVE_MAX_BATCH_SIZE=1``),
  one sentence per request from many clients;
* HTTP throughput vs the in-process engine (same artefact, same thread count, batches of the
  service's max batch size);
* process RSS with both models loaded; CPU use of the server while under load.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import CpuMeter, Results, Row, Server, free_port, rss_mb
from benchmarks.loadgen import run_load, wait_ready


class Service:
    """``python -m service`` on a free port, both models, CPU, a fixed variant and thread count."""

    def __init__(
        self,
        artefact_root: Path,
        translate_model: str,
        embed_model: str,
        *,
        variant: str,
        threads: int,
        log: Path,
        extra_env: dict[str, str] | None = None,
        ready_timeout_s: float = 600,
    ) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            "TSERVE_HOST": "127.0.0.1",
            "TSERVE_PORT": str(self.port),
            "TSERVE_ARTEFACT_ROOT": str(artefact_root.resolve()),
            "TSERVE_TRANSLATE_MODEL": translate_model,
            "TSERVE_EMBED_MODEL": embed_model,
            "TSERVE_PROVIDER": "cpu",
            "TSERVE_VARIANT": variant,
            "TSERVE_AUTO_EXPORT": "false",
            "TSERVE_INTRA_OP_THREADS": str(threads),
            "TSERVE_MAX_QUEUE": "8192",
            "TSERVE_REQUEST_TIMEOUT_S": "600",
            "TSERVE_LOG_LEVEL": "warning",
            "OMP_NUM_THREADS": str(threads),
            **(extra_env or {}),
        }
        self.server = Server([sys.executable, "-m", "service"], env, log)
        try:
            wait_ready(f"{self.base}/health/ready", ready_timeout_s, self.server.alive)
        except Exception as e:
            tail = self.server.log_tail()
            self.server.stop()
            raise RuntimeError(f"service did not become ready: {e}\n{tail}") from e
        self.rss_at_start = self.rss_mb()

    @property
    def pid(self) -> int:
        return self.server.pid

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def stop(self) -> None:
        self.server.stop()


def load_row(
    results: Results,
    section: str,
    system: str,
    url: str,
    body: Any,
    pids: Sequence[int],
    *,
    clients: int,
    items: int,
    duration_s: float,
    baseline: bool = False,
) -> Row | None:
    meter = CpuMeter(pids)
    with meter.measure() as cpu:
        res = run_load(url, body, concurrency=clients, items_per_request=items, duration_s=duration_s)
    if res.requests == 0:
        results.note(f"{section}: {system}: no successful request ({res.errors} errors: {res.first_error})")
        return None
    extra: dict[str, Any] = {
        "p50_ms": round(res.percentile_ms(50), 1),
        "p99_ms": round(res.percentile_ms(99), 1),
        "server_cores_busy": round(cpu["cores_busy"], 2),
        "machine_busy_pct": round(cpu["machine_busy_pct"], 1),
    }
    if res.errors:
        extra["errors"] = res.errors
    return results.add(Row(section, system, res.items_per_s, "items/s", baseline=baseline, extra=extra))
