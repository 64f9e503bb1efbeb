"""Real server processes for the tests (reliability, e2e, shutdown, deploy): uvicorn on loopback.

Two servers: ``small_server_command`` is tests/service/run_small_server.py (the real entry point
``service.__main__.serve`` over the small NumPy engines, whose per-batch delay makes latencies a
matter of design rather than of CPU speed); ``service_command`` is ``python -m service`` itself,
for real ONNX artefacts. Every request goes to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def small_server_command(delay_s: float = 0.0) -> list[str]:
    return [sys.executable, "-m", "tests.service.run_small_server", "--delay-s", str(delay_s)]


def service_command() -> list[str]:
    return [sys.executable, "-m", "service"]


Labels = frozenset[tuple[str, str]]


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def scrape(self) -> dict[tuple[str, Labels], float]:
        """Every sample of ``/metrics``, keyed by (sample name, labels)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        return self.scrape().get((name, frozenset(labels.items())), 0.0)

    def rss_bytes(self) -> int:
        rss: int = psutil.Process(self.proc.pid).memory_info().rss
        return rss

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited during startup with {proc.returncode}"
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("the server never became ready")


def server_env(port: int, env: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without its ``TSERVE_*``, serving on 127.0.0.1:``port``, no drain
    delay."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TSERVE_")},
        "PYTHONPATH": str(ROOT),
        "TSERVE_HOST": "127.0.0.1",
        "TSERVE_PORT": str(port),
        "TSERVE_LOG_LEVEL": "warning",
        "TSERVE_DRAIN_DELAY_S": "0",  # tests stop their servers at once unless they test the drain
        **env,
    }


@contextmanager
def server_process(
    command: list[str], env: Mapping[str, str], log_path: Path, *, ready_timeout_s: float = 120
) -> Iterator[ServerProcess]:
    """Start ``command`` with ``TSERVE_*`` from ``env`` on a free loopback port; stop it after.

    Its output goes to ``log_path`` and is printed on the way out (pytest shows it on failure).
    """
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=server_env(port, env), stdout=log, stderr=subprocess.STDOUT
        )
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        wait_ready(server.url, proc, ready_timeout_s)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print(server.log()[-5000:])


def artefact_env(root: Path) -> dict[str, str]:
    """``python -m service`` on the tiny models of ``artefact_root``, one onnxruntime thread each."""
    return {
        "TSERVE_ARTEFACT_ROOT": str(root),
        "TSERVE_TRANSLATE_MODEL": "tiny-en-de",
        "TSERVE_EMBED_MODEL": "tiny-bert",
        "TSERVE_VARIANT": "fp32",
        "TSERVE_PROVIDER": "cpu",
        "TSERVE_AUTO_EXPORT": "false",
        "TSERVE_INTRA_OP_THREADS": "1",
    }
