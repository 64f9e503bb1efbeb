"""What a request's ASGI scope carries between the server and the routes: the extensions the
service's HTTP protocol (``service/http/limits.py``) puts there, and the stages a route times into
its ``Server-Timing`` header. The one place their keys are named.

Both extensions are futures of the connection's event loop. They exist only under ``python -m service``;
under another server (tests' in-process transport, plain uvicorn) a reader finds neither and
falls back to plain ASGI (a watcher of ``http.disconnect``, a timed ``receive``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from starlette.types import Scope

# Done once the connection is lost before the response completes: the request's work stops
# without a watcher task of its own (``service.api.dependencies.until_disconnect``).
DISCONNECT_EXTENSION = "tserve.disconnected"

# Done once the request's whole body has arrived, so what is left to receive is already
# buffered and reading it needs no deadline (``service.http.middleware.BodyLimitMiddleware``).
BODY_RECEIVED_EXTENSION = "tserve.body_received"

SERVER_TIMING_STAGES = "server_timing"  # key in the request's state: the route's own stages, in order


@contextlib.contextmanager
def timed_stage(scope: Scope, name: str, description: str) -> Iterator[None]:
    """Time a stage of this request's route into its ``Server-Timing`` header (also when it fails:
    an error's timings show where the time went)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        stages = scope.setdefault("state", {}).setdefault(SERVER_TIMING_STAGES, [])
        stages.append((name, time.perf_counter() - start, description))
