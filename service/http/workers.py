"""``TSERVE_WORKERS`` > 1: that many serving processes on one listening socket, and the parent
process that keeps them.

The parent binds the socket once and starts every serving process with it (multiprocessing's
spawn: a fresh interpreter, which imports prometheus_client with ``PROMETHEUS_MULTIPROC_DIR``
already set, so its metrics go to files that ``/metrics`` adds up, ``service/metrics.py``). The
kernel queues connections on the one socket and whichever process accepts first takes each
(docs/decisions.md says why not ``SO_REUSEPORT``). Each process loads its own models, queues and
translation cache, and serves as a single one does (``service/__main__.py``).

- Readiness: each process marks its byte of a shared array at each change of its state, and
  ``/health/ready`` in any of them is 200 only while every byte says ready.
- A process that dies (killed, out of memory, a crash) is replaced at once; its byte says not
  ready until the replacement is, so the host is not ready meanwhile. One that exits 1, its models
  unservable, stops them all and the parent exits 1, as a single process would.
- SIGTERM or SIGINT: the parent closes its copy of the socket and passes SIGTERM on to every
  process, each of which drains as a single one does; the parent exits when they all have. A
  second signal is passed on too (the processes stop waiting).
- The processes have their own process group, so that a terminal's Ctrl-C reaches the parent only
  (which passes it on once, rather than each process taking it as a first and the parent's as a
  second), and they get SIGTERM should the parent die (Linux's ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from ctypes import Array, c_byte
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from prometheus_client import multiprocess

from service.settings import Settings

log = logging.getLogger(__name__)

_SPAWN = multiprocessing.get_context("spawn")
_BACKLOG = 2048  # uvicorn's own default
_POLL_S = 0.2  # how soon a signal is acted on while no process ends
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_CANNOT_SERVE = 1  # a serving process's exit code when its models cannot be served


class Peers:
    """One serving process's view of every process's readiness: a byte each, in memory shared
    by the host's processes (``service.serving.runtime.Peers``)."""

    def __init__(self, slots: Array[c_byte], index: int) -> None:
        self._slots = slots
        self._index = index

    def mark(self, ready: bool) -> None:
        self._slots[self._index] = int(ready)

    def not_ready(self) -> int:
        return sum(not ready for ready in self._slots)


Serve = Callable[[socket.socket, Peers], None]  # a serving process's body; exits with its code


def run_workers(settings: Settings, serve: str) -> int:
    """Run ``settings.workers`` processes on one socket until a signal, replacing those that die;
    the parent's exit code. Each process runs ``serve``, named as ``module:function`` and imported
    in it: spawn would look a function of ``python -m service``'s ``__main__`` up in the process's
    own ``__main__``, which is not that module."""
    directory, temporary = _metrics_directory(settings.metrics_dir)
    # Read by prometheus_client when a serving process imports it: set before any starts.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    listener = socket.create_server((settings.host, settings.port), family=family, backlog=_BACKLOG)
    listener.set_inheritable(True)
    log.info("serving on %s:%d with %d processes", settings.host, settings.port, settings.workers)
    try:
        return _Supervisor(settings.workers, serve, listener, directory).run()
    finally:
        listener.close()
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)


def _metrics_directory(configured: Path | None) -> tuple[Path, bool]:
    """The processes' metric files' directory, empty: the configured one cleared of an earlier
    run's files (which prometheus_client would add in), or a new temporary one (True)."""
    if configured is None:
        return Path(tempfile.mkdtemp(prefix="tserve-metrics-")), True
    configured.mkdir(parents=True, exist_ok=True)
    for stale in configured.glob("*.db"):
        stale.unlink()
    return configured, False


class _Supervisor:
    def __init__(self, count: int, serve: str, listener: socket.socket, directory: Path) -> None:
        self._serve = serve
        self._listener = listener
        self._directory = directory
        self._slots: Array[c_byte] = _SPAWN.RawArray(c_byte, count)
        self._live: dict[int, BaseProcess] = {}  # by slot
        self._signals = 0  # received
        self._passed_on = 0  # of them, passed on to the processes
        self._exit_code = 0

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._received)
        for index in range(len(self._slots)):
            self._start(index)
        while self._live:
            wait([p.sentinel for p in self._live.values()], timeout=_POLL_S)
            if self._signals > self._passed_on:
                self._stop()
            for index, process in list(self._live.items()):
                if process.exitcode is not None:
                    self._ended(index, process)
        return self._exit_code

    def _received(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1  # acted on in the loop: nothing here may block or start processes

    def _start(self, index: int) -> None:
        process = _SPAWN.Process(
            target=_serving_process,
            args=(self._serve, self._listener, Peers(self._slots, index)),
            name=f"tserve-{index}",
        )
        process.start()
        self._live[index] = process

    def _stop(self) -> None:
        """Pass SIGTERM on to every process; the first time, first close the parent's socket, so
        that the listener is gone once each process has closed its own."""
        if not self._passed_on:
            log.info("stopping: draining %d processes", len(self._live))
            self._listener.close()
        self._passed_on = self._signals
        for process in self._live.values():
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, signal.SIGTERM)

    def _ended(self, index: int, process: BaseProcess) -> None:
        del self._live[index]
        self._slots[index] = 0
        # Its live gauges leave the sums; its counters and histograms stay in them.
        multiprocess.mark_process_dead(process.pid, str(self._directory))  # type: ignore[no-untyped-call]
        code = process.exitcode
        if self._passed_on:
            if code:
                log.warning("serving process %d exited with %s while stopping", process.pid, code)
            return
        if code == _CANNOT_SERVE:
            log.error("serving process %d cannot serve: stopping", process.pid)
            self._exit_code = _CANNOT_SERVE
            self._signals += 1
            self._stop()
            return
        log.warning("serving process %d ended (exit code %s): starting another", process.pid, code)
        self._start(index)


def _serving_process(serve: str, listener: socket.socket, peers: Peers) -> None:
    os.setpgrp()
    with contextlib.suppress(OSError, AttributeError):  # not Linux: an orphan serves on
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    module, function = serve.split(":")
    body: Serve = getattr(importlib.import_module(module), function)
    body(listener, peers)
