"""Why a request is not served, and the one mapping of every such reason to a ``Failure``.

A ``Failure`` is what every API shape renders (``service/api/error_responses.py``: our error body, and
LibreTranslate's ``{"error": ...}``): so a queue that is full is a 429 with ``Retry-After``
whichever API the request came through, and only the body's shape differs. The status says who
should act: 4xx the client (fix the request, or slow down for 429), 5xx the operator (503 not
ready or shutting down, 504 deadline, 500 a bug).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.queue import DeadlineExceeded, QueueClosed, QueueFull

# A validation problem as pydantic reports one, so the checks that need the loaded model or the
# settings read like the schema's own: {"type", "loc": ("body", field, ...), "msg", "ctx"?}.
Problem = Mapping[str, Any]


class ServiceError(Exception):
    """A request refused or failed, with the status and kind every API shape answers; a
    subclass names its own (``class NotReady(ServiceError, status=503, kind="not_ready")``)."""

    status_code = 500
    type = "internal_error"

    def __init_subclass__(cls, status: int | None = None, kind: str | None = None) -> None:
        super().__init_subclass__()
        if status is not None and kind is not None:
            cls.status_code, cls.type = status, kind

    def __init__(
        self, message: str, *, limit: float | str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.message = message
        self.limit = limit
        self.headers = headers or {}


class NotReady(ServiceError, status=503, kind="not_ready"):
    """The models are still loading, or could not be loaded (the message says why)."""


class ShuttingDown(ServiceError, status=503, kind="shutting_down"):
    """Draining: requests in flight finish, new ones go to another replica."""


class ModelNotFound(ServiceError, status=404, kind="model_not_found"):
    """A model name not served, or a task no model is configured for."""


class Unauthorized(ServiceError, status=401, kind="unauthorized"):
    """API keys are configured and the request offers none."""


class Forbidden(ServiceError, status=403, kind="forbidden"):
    """API keys are configured and none the request offers is one of them."""


class UnsupportedMediaType(ServiceError, status=415, kind="unsupported_media_type"):
    """A body in a format the API does not read."""


class InternalError(ServiceError):
    """A server-side failure the client cannot fix (engine crash, a bad item we did not expect)."""


class InvalidRequest(ServiceError, status=422, kind="validation_error"):
    """The request cannot be served as asked: each problem names its field and limit."""

    def __init__(self, problems: Sequence[Problem], *, headers: dict[str, str] | None = None) -> None:
        super().__init__("; ".join(str(p.get("msg")) for p in problems), headers=headers)
        self.problems = list(problems)


def problem(kind: str, loc: tuple[str | int, ...], message: str, limit: float | str | None = None) -> Problem:
    """One validation problem of the request's body at ``loc`` (a field, then indices)."""
    found: dict[str, Any] = {"type": kind, "loc": ("body", *loc), "msg": message}
    if limit is not None:
        found["ctx"] = {"limit": limit}
    return found


# What a request may end in besides its result: each maps to a Failure.
SERVING_ERRORS = (ServiceError, QueueFull, DeadlineExceeded, QueueClosed)


@dataclass(frozen=True)
class Failure:
    """An error as the API shapes render it: status, kind, message, the limit that was exceeded,
    response headers, and for an invalid request its problems (which each shape words itself)."""

    status: int
    type: str
    message: str
    limit: float | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    problems: Sequence[Problem] | None = None

    @property
    def for_operator(self) -> bool:
        """5xx: the service's to fix; its answer carries the request id to quote."""
        return self.status >= 500


def failure_of(error: ServiceError | QueueFull | DeadlineExceeded | QueueClosed) -> Failure:
    if isinstance(error, InvalidRequest):
        return Failure(422, error.type, error.message, headers=error.headers, problems=error.problems)
    if isinstance(error, ServiceError):
        return Failure(error.status_code, error.type, error.message, error.limit, error.headers)
    if isinstance(error, QueueFull):
        return Failure(429, "queue_full", str(error), error.limit, {"Retry-After": str(error.retry_after_s)})
    if isinstance(error, DeadlineExceeded):
        return Failure(504, "deadline_exceeded", str(error), error.timeout_s)
    return Failure(503, "shutting_down", str(error), headers={"Connection": "close"})
