"""What every benchmark shares: timing, CPU/RSS sampling, data, server processes."""

from __future__ import annotations

import gzip
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.loadgen import BodyFactory, LoadResult, run_load, wait_ready

REPO = Path(__file__).resolve().parent.parent
SETTLE_S = 3.0  # the service's default memory trim interval (2 s) and one more second


def percentiles_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    if not latencies_s:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    a = np.asarray(latencies_s) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


class CpuMeter:
    """CPU seconds used by some processes over a window, as cores busy and % of the machine."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.procs = [psutil.Process(p) for p in pids]

    def cpu_seconds(self) -> float:
        """User + system CPU time the processes and their children have used so far."""
        total = 0.0
        for p in self.procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
                for c in p.children(recursive=True):
                    ct = c.cpu_times()
                    total += ct.user + ct.system
            except psutil.NoSuchProcess:
                pass
        return total

    @contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        out: dict[str, float] = {}
        c0, t0 = self.cpu_seconds(), time.perf_counter()
        sys0 = psutil.cpu_times()
        yield out
        wall = time.perf_counter() - t0
        sys1 = psutil.cpu_times()
        busy = lambda t: t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)  # noqa: E731
        out["cores_busy"] = (self.cpu_seconds() - c0) / wall if wall else 0.0
        out["machine_busy_pct"] = 100 * (busy(sys1) - busy(sys0)) / wall / (psutil.cpu_count() or 1)


def metered_load(
    url: str, body: BodyFactory, pids: Sequence[int], **load: Any
) -> tuple[LoadResult, dict[str, float]]:
    """One ``run_load`` (``load``: its keyword arguments) with the server processes' CPU metered
    over it: the run, with its server CPU per request, and ``CpuMeter.measure``'s figures."""
    meter = CpuMeter(pids)
    with meter.measure() as cpu:
        res = run_load(url, body, server_cpu=meter.cpu_seconds, **load)
    return res, cpu


def load_extra(res: LoadResult, cpu: dict[str, float]) -> dict[str, Any]:
    """The columns of an HTTP row: latency percentiles, the server's CPU (cores busy over the
    run, CPU-milliseconds per completed request in the timed window), the machine's load, and
    the errors if any."""
    extra: dict[str, Any] = {
        "p50_ms": round(res.percentile_ms(50), 1),
        "p99_ms": round(res.percentile_ms(99), 1),
        "server_cores_busy": round(cpu["cores_busy"], 2),
        "server_cpu_ms_per_request": round(res.server_cpu_ms_per_request, 2),
        "machine_busy_pct": round(cpu["machine_busy_pct"], 1),
    }
    if res.errors:
        extra["errors"] = res.errors
    return extra


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, in MB."""
    p = psutil.Process(pid)
    total = p.memory_info().rss
    for c in p.children(recursive=True):
        with suppress(psutil.NoSuchProcess):
            total += c.memory_info().rss
    return total / 1e6


def peak_rss_mb(pid: int) -> float:
    """The highest resident memory a process has had since it started (the kernel's ``VmHWM``),
    in MB: exact, where sampling (:class:`RssPeak`) can miss a short spike."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


class RssPeak:
    """The highest resident memory of a process (and its children) while it runs, sampled on a
    thread every ``period_s``: a load's peak, which a reading after the load misses."""

    def __init__(self, pid: int, period_s: float = 0.2) -> None:
        self.pid, self.period_s = pid, period_s
        self.peak_mb = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name=f"rss-{pid}", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.period_s):
            with suppress(psutil.NoSuchProcess):
                self.peak_mb = max(self.peak_mb, rss_mb(self.pid))

    def stop(self) -> float:
        """Stop sampling; the peak."""
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next(
            (ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), ""
        )
        vnni = "avx512_vnni" in flags
    except OSError:
        vnni = False
    return {
        "cpu": cpu,
        "logical_cores": psutil.cpu_count(),
        "avx512_vnni": vnni,
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
    }


def other_load(interval_s: float = 2.0) -> dict[str, Any]:
    """How busy the machine is before the benchmark starts, and its busiest processes."""
    procs = list(psutil.process_iter(["cmdline", "name"]))
    for p in procs:
        with suppress(psutil.Error):
            p.cpu_percent(None)
    busy = psutil.cpu_percent(interval=interval_s)
    users = []
    for p in procs:
        with suppress(psutil.Error):
            users.append((p.cpu_percent(None), " ".join(p.info["cmdline"] or [p.info["name"] or "?"])[:100]))
    users.sort(reverse=True)
    return {"busy_pct": busy, "busiest": [f"{c:.0f}% {cmd}" for c, cmd in users[:3] if c >= 5]}


def versions(names: Sequence[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = "not installed"
    return out


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def sts_sentences(data_dir: Path) -> list[str]:
    """The STS-dev sentences (both columns, in file order, deduplicated)."""
    seen: dict[str, None] = {}
    for line in read_lines(data_dir / "stsb" / "sts-dev.csv"):
        parts = line.split("\t")
        if len(parts) >= 7:
            seen.setdefault(parts[5].strip(), None)
            seen.setdefault(parts[6].strip(), None)
    return [s for s in seen if s]


class Server:
    """A server subprocess of ours (or a peer's), stopped with SIGTERM, then SIGKILL, by its pid."""

    def __init__(
        self, cmd: Sequence[str], env: dict[str, str], log_path: Path, cwd: Path = REPO, cores: int = 0
    ) -> None:
        """``cores``: run on that many of this process's cores (CPU affinity, Linux); 0: on all."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            list(cmd),
            env={**os.environ, **env},
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if cores and hasattr(os, "sched_setaffinity"):
            # the service starts its threads after its imports: every one inherits the affinity
            os.sched_setaffinity(self.proc.pid, sorted(os.sched_getaffinity(0))[:cores])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """``python -m service`` (or ``module``) on a free port, CPU, a fixed variant, on ``threads``
    cores, which it divides among its concurrent runs as its default settings do; serving the
    translation models named (none: no translation) and the embedding model named ("": none)."""

    def __init__(
        self,
        artefact_root: Path,
        translate_models: Sequence[str],
        embed_model: str,
        *,
        variant: str,
        threads: int,
        log: Path,
        extra_env: dict[str, str] | None = None,
        ready_timeout_s: float = 600,
        module: str = "service",
    ) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            "TSERVE_HOST": "127.0.0.1",
            "TSERVE_PORT": str(self.port),
            "TSERVE_ARTEFACT_ROOT": str(artefact_root.resolve()),
            # an empty list would mean the defaults: no translation is an empty model name
            **(
                {"TSERVE_TRANSLATE_MODELS": ",".join(translate_models)}
                if translate_models
                else {"TSERVE_TRANSLATE_MODEL": ""}
            ),
            "TSERVE_EMBED_MODEL": embed_model,
            "TSERVE_PROVIDER": "cpu",
            "TSERVE_VARIANT": variant,
            "TSERVE_AUTO_EXPORT": "false",
            # the service divides its cores among the runs it has in flight (Settings.session_threads)
            "TSERVE_INTRA_OP_THREADS": "0",
            "TSERVE_MAX_QUEUE": "8192",
            "TSERVE_REQUEST_TIMEOUT_S": "600",
            "TSERVE_LOG_LEVEL": "warning",
            # no load balancer to tell of a shutdown: stop at once, not after the 10 s drain delay
            "TSERVE_DRAIN_DELAY_S": "0",
            # the load runs send the same sentences again and again: they measure decoding
            "TSERVE_TRANSLATION_CACHE_BYTES": "0",
            "OMP_NUM_THREADS": str(threads),
            **(extra_env or {}),
        }
        self.server = Server([sys.executable, "-m", module], env, log, cores=threads)
        try:
            wait_ready(f"{self.base}/health/ready", ready_timeout_s, self.server.alive)
        except Exception as e:
            tail = self.server.log_tail()
            self.server.stop()
            raise RuntimeError(f"service did not become ready: {e}\n{tail}") from e
        self.rss_at_start = self.rss_mb()
        self.rss_peak = RssPeak(self.pid)  # over every load this service serves

    @property
    def pid(self) -> int:
        return self.server.pid

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def settled_rss_mb(self) -> float:
        """Resident memory once the service has been idle for a while: it gives freed memory back
        to the OS within ``TSERVE_MEMORY_TRIM_INTERVAL_S`` (2 s by default) of its last request
        (service/memory.py), so a reading taken at once may still hold the last load's buffers."""
        time.sleep(SETTLE_S)
        return self.rss_mb()

    def stop(self) -> None:
        self.rss_peak.stop()
        self.server.stop()
