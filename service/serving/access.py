"""Whether a request may be served at all: the API key, and the service's readiness.

Every API takes its key its own way (a bearer token; LibreTranslate's ``api_key`` in the body or
the query too); the check of what it offers is this one.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence

from service.serving.failures import Forbidden, NotReady, ShuttingDown, Unauthorized
from service.serving.runtime import Runtime


def check_api_key(keys: Sequence[str], offered: Iterable[str | None]) -> str | None:
    """Nothing to check without configured ``keys`` (None); else one of the ``offered`` keys (the
    empty and absent ones aside) must be one of them: 401 when none is offered, 403 when none
    matches. → the configured key that matched, whose quota the request is charged to."""
    if not keys:
        return None
    given = [key.encode() for key in offered if key]
    if not given:
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>'", headers={"WWW-Authenticate": "Bearer"}
        )
    # Every offered key against every key, each in constant time and with no early exit: how long
    # the check takes says nothing about which key matched, or how much of one.
    matched = [key for g in given for key in keys if secrets.compare_digest(g, key.encode())]
    if not matched:
        raise Forbidden("invalid API key")
    return matched[0]


def ready(runtime: Runtime) -> Runtime:
    """503 unless every model is loaded and warmed up and the service is not shutting down."""
    if runtime.state == "ready":
        return runtime
    if runtime.state == "draining":
        raise ShuttingDown("shutting down; retry on another replica", headers={"Connection": "close"})
    detail = f": {runtime.detail}" if runtime.detail else ""
    raise NotReady(f"not ready ({runtime.state}{detail})", headers={"Retry-After": "5"})
