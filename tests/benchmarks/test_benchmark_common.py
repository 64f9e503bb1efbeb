"""The harness's server processes: a server given ``cores`` runs on that many cores."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from benchmarks.common import Server

PRINT_CORES = "import os, time; time.sleep(0.5); print(len(os.sched_getaffinity(0)), flush=True)"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_a_server_given_cores_runs_on_that_many(tmp_path: Path) -> None:
    available = len(os.sched_getaffinity(0))
    for cores, expected in ((1, 1), (0, available)):
        server = Server([sys.executable, "-c", PRINT_CORES], {}, tmp_path / f"{cores}.log", cores=cores)
        server.proc.wait(30)
        server.stop()
        assert (tmp_path / f"{cores}.log").read_text().strip() == str(expected)
