"""SIGTERM on the real server process: drain, finish in-flight work, exit 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[3]


def _batches_started(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=2).text
    found = re.search(r'^tserve_batch_size_count\{model="small-embed"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_sigterm_drains_then_exits_0(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TSERVE_HOST": "127.0.0.1",
        "TSERVE_PORT": str(port),
        "TSERVE_DRAIN_DELAY_S": "1.0",
        "TSERVE_SHUTDOWN_GRACE_S": "20",
        "TSERVE_REQUEST_TIMEOUT_S": "30",
    }
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.service.run_small_server", "--delay-s", "2.5"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(url, proc)
        slow: dict[str, httpx.Response] = {}
        worker = threading.Thread(
            target=lambda: slow.update(
                r=httpx.post(f"{url}/v1/embed", json={"texts": ["slow one"]}, timeout=30)
            )
        )
        worker.start()
        deadline = time.monotonic() + 10
        # In the engine, not merely arrived: one that has not yet passed the readiness check
        # when the signal comes is refused, rightly.
        while _batches_started(url) < 1:
            assert time.monotonic() < deadline, "the slow request never arrived"
            time.sleep(0.02)

        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while (ready := httpx.get(f"{url}/health/ready", timeout=2)).status_code == 200:
            assert time.monotonic() < deadline, "readiness never flipped"
            time.sleep(0.01)
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = httpx.post(f"{url}/v1/translate", json={"text": "too late"}, timeout=5)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "shutting_down"
        assert httpx.get(f"{url}/health/live", timeout=2).status_code == 200  # still alive while draining

        worker.join(30)
        assert slow["r"].status_code == 200, slow["r"].text
        assert len(slow["r"].json()["embeddings"]) == 1
        assert proc.wait(30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health/live", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        print(log_path.read_text(errors="replace"))


def test_models_that_cannot_be_served_exit_1(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TSERVE_HOST": "127.0.0.1",
        "TSERVE_PORT": str(free_port()),
        "TSERVE_ARTEFACT_ROOT": str(tmp_path),
        "TSERVE_AUTO_EXPORT": "false",
    }
    done = subprocess.run(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "python -m export default" in done.stderr + done.stdout
