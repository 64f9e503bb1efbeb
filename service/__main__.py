"""``python -m service``: uvicorn serving ``create_app(Settings())``, in one process or, with
``TSERVE_WORKERS`` > 1, in that many on one socket (``service/http/workers.py``).

uvicorn with httptools, bounded against hostile clients by ``service.http.limits`` (head
deadline and size, connection cap) and ``BodyLimitMiddleware`` (body size, deadline, format).

One process, one event loop: the queues' worker threads and onnxruntime's own threads do the
parallel work, but the loop's own work (HTTP, JSON, tokenizing for the queue) runs on one core.
Where that core is what limits (small requests at a rate a GPU keeps up with), several processes
share the host; each holds its own models (docs/deployment.md, "Several serving processes").

SIGTERM (or Ctrl-C) drains: readiness and new model requests turn 503 at once; after
``drain_delay_s`` the listener closes; in-flight requests get ``shutdown_grace_s`` to finish;
then the process exits 0. A second signal forces the exit. Models that cannot be loaded exit 1.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI

from service.http.app import create_app
from service.http.limits import ConnectionLimits, LimitedHttpToolsProtocol
from service.http.workers import Peers, run_workers
from service.memory import limit_heaps, map_large_blocks
from service.serving.runtime import Runtime
from service.settings import Settings

log = logging.getLogger("service")


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain phase before its own graceful shutdown, and exit 0 after it.

    (uvicorn re-raises a caught SIGTERM once it has shut down, which would end the process
    with 143; a drained shutdown is a clean one.)
    """

    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.exit_code = 0
        self._signalled = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A Python signal handler runs on the main thread between any two of its bytecodes,
        # perhaps inside a `with lock:` that thread holds (prometheus_client's multiprocess
        # values share one non-reentrant lock): it takes no lock, it only schedules the drain.
        if self._signalled:  # a second signal: stop waiting for anyone
            self.should_exit = self.force_exit = True
            return
        self._signalled = True
        asyncio.get_running_loop().call_soon_threadsafe(self._drain, signal.Signals(sig).name)

    def _drain(self, signal_name: str) -> None:
        log.info("received %s: draining", signal_name)
        self.runtime.begin_drain()
        delay = self.runtime.settings.drain_delay_s
        if delay <= 0:
            self.should_exit = True
            return
        asyncio.get_running_loop().call_later(delay, setattr, self, "should_exit", True)

    def fail(self, error: BaseException) -> None:
        """The models cannot be served: stop, and exit 1 so the orchestrator shows it."""
        self.exit_code = 1
        self.should_exit = True


def serve(app: FastAPI, settings: Settings, listener: socket.socket | None = None) -> int:
    """Run ``app`` until a signal or a fatal load error, on ``listener`` if given (else on a
    socket of its own); the process's exit code."""
    runtime: Runtime = app.state.runtime
    limits = ConnectionLimits.from_settings(settings)
    log.info("open connections capped at %d", limits.max_connections)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        http=LimitedHttpToolsProtocol.for_limits(limits),
        ws="none",  # no WebSocket routes: an Upgrade request is an ordinary request
        timeout_keep_alive=settings.keep_alive_timeout_s,
        log_level=settings.log_level,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
        lifespan="on",
        access_log=settings.log_level == "debug",
    )
    server = DrainingServer(config, runtime)
    runtime.on_fatal = server.fail
    server.run(sockets=None if listener is None else [listener])
    return server.exit_code


def prepare_process(settings: Settings) -> None:
    """What the process sets before any of its threads starts: glibc's heaps, logging."""
    limit_heaps(settings.malloc_heaps)
    map_large_blocks(settings.malloc_mmap_threshold_kb)
    process = " [%(process)d]" if settings.workers > 1 else ""  # whose line, among the processes
    logging.basicConfig(
        level=settings.log_level.upper(), format=f"%(asctime)s %(levelname)s{process} %(name)s: %(message)s"
    )


def serve_process(listener: socket.socket, peers: Peers) -> None:
    """One of ``TSERVE_WORKERS`` serving processes, started by ``run_workers``."""
    settings = Settings()
    prepare_process(settings)
    app = create_app(settings)
    app.state.runtime.peers = peers
    sys.exit(serve(app, settings, listener))


def main() -> int:
    settings = Settings()
    prepare_process(settings)
    if settings.workers > 1:
        return run_workers(settings, f"service.__main__:{serve_process.__name__}")
    return serve(create_app(settings), settings)


if __name__ == "__main__":
    sys.exit(main())
