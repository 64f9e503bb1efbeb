"""The harness's server processes: a server given ``cores`` runs on that many cores; a load's peak
resident memory is caught even when the memory is given back before anyone reads it (sampled, and
the kernel's high-water mark)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.common import RssPeak, Server, peak_rss_mb, rss_mb

PRINT_CORES = "import os, time; time.sleep(0.5); print(len(os.sched_getaffinity(0)), flush=True)"
# 200 MB touched for a second, then freed (a large block is its own mapping: unmapped when freed)
SPIKE = (
    "import time; print('up', flush=True); time.sleep(0.5); b = bytearray(200_000_000); time.sleep(1.0); "
    "del b; print('freed', flush=True); time.sleep(60)"
)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_a_server_given_cores_runs_on_that_many(tmp_path: Path) -> None:
    available = len(os.sched_getaffinity(0))
    for cores, expected in ((1, 1), (0, available)):
        server = Server([sys.executable, "-c", PRINT_CORES], {}, tmp_path / f"{cores}.log", cores=cores)
        server.proc.wait(30)
        server.stop()
        assert (tmp_path / f"{cores}.log").read_text().strip() == str(expected)


def test_the_peak_of_a_load_is_kept_after_its_memory_is_freed(tmp_path: Path) -> None:
    log = tmp_path / "spike.log"
    server = Server([sys.executable, "-c", SPIKE], {}, log)
    try:
        _wait_for(log, "up")
        peak = RssPeak(server.pid, period_s=0.05)
        before = peak.peak_mb
        _wait_for(log, "freed")
        after = rss_mb(server.pid)
        assert peak.stop() >= before + 190
        assert after < before + 50
        assert peak_rss_mb(server.pid) >= before + 190  # the kernel's high-water mark, unsampled
    finally:
        server.stop()


def _wait_for(log: Path, line: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in log.read_text().split():
        assert time.monotonic() < deadline, f"{line!r} not printed within {timeout_s:g} s"
        time.sleep(0.05)
