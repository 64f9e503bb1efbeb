"""The load generator's server CPU per request, against a real server process."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.common import CpuMeter, load_extra
from benchmarks.loadgen import run_load
from tests.servers import server_process, small_server_command

DELAY_S = 0.01  # each engine batch takes a little wall time, as a model would


def test_server_cpu_per_request_is_the_server_s_cpu_over_the_timed_window(tmp_path: Path) -> None:
    with server_process(small_server_command(DELAY_S), {}, tmp_path / "server.log") as server:
        meter = CpuMeter([server.proc.pid])
        url = f"{server.url}/v1/embed"
        with meter.measure() as cpu:
            before = meter.cpu_seconds()
            res = run_load(
                url,
                lambda i: {"texts": [f"sentence {i}"]},
                concurrency=4,
                n_requests=120,
                server_cpu=meter.cpu_seconds,
            )
            whole_run = meter.cpu_seconds() - before
        plain = run_load(url, lambda i: {"texts": ["x"]}, concurrency=2, n_requests=4)
    assert res.requests == 120 and res.errors == 0
    assert res.server_cpu_s is not None and 0 < res.server_cpu_s <= whole_run
    assert math.isclose(res.server_cpu_ms_per_request, 1000 * res.server_cpu_s / 120)
    extra = load_extra(res, cpu)
    assert extra["server_cpu_ms_per_request"] == round(res.server_cpu_ms_per_request, 2)
    assert plain.server_cpu_s is None and math.isnan(plain.server_cpu_ms_per_request)
