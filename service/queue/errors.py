"""Why a request to a model's queue gets no result; the API maps each to its HTTP status."""

from __future__ import annotations


class QueueFull(RuntimeError):
    """The queue cannot take the request's items; retry after ``retry_after_s`` (→ 429)."""

    def __init__(self, model: str, limit: int, retry_after_s: int) -> None:
        super().__init__(f"{model}: queue full ({limit} items); retry after {retry_after_s} s")
        self.limit = limit
        self.retry_after_s = retry_after_s


class DeadlineExceeded(TimeoutError):
    """The request's deadline passed before all its items were computed (→ 504)."""

    def __init__(self, model: str, timeout_s: float) -> None:
        super().__init__(f"{model}: no result within the request deadline of {timeout_s:g} s")
        self.timeout_s = timeout_s


class QueueClosed(RuntimeError):
    """The queue is draining or closed: the service is shutting down (→ 503)."""


class EngineFailure(RuntimeError):
    """The engine call for a whole batch (or a decoder step) raised; every item in it gets this
    (→ 500)."""
