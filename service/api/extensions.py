"""The ASGI extensions the service's HTTP protocol (``service/http_limits.py``) puts in each
request's scope, and the application reads: the one place their keys are named.

Both are futures of the connection's event loop. They exist only under ``python -m service``;
under another server (tests' in-process transport, plain uvicorn) a reader finds neither and
falls back to plain ASGI (a watcher of ``http.disconnect``, a timed ``receive``).
"""

from __future__ import annotations

# Done once the connection is lost before the response completes: the request's work stops
# without a watcher task of its own (``service.api.dependencies.until_disconnect``).
DISCONNECT_EXTENSION = "tserve.disconnected"

# Done once the request's whole body has arrived, so what is left to receive is already
# buffered and reading it needs no deadline (``service.api.middleware.BodyLimitMiddleware``).
BODY_RECEIVED_EXTENSION = "tserve.body_received"
