"""The submit step both tasks share: a request's items to its model's queue, awaited for as long
as its client is there, and the results all-or-nothing.

All-or-nothing keeps the response's arrays aligned with the request's: one text that cannot be
computed fails the request, and the error names every such text by its index.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from service.engine.base import TextTooLong
from service.queue import DecodeTooLarge, EngineFailure, RequestQueue
from service.serving.failures import InternalError, InvalidRequest, problem

T = TypeVar("T")
R = TypeVar("R")


class Client(Protocol):
    """What the serving layer needs of whoever carried the request (``service/api``: HTTP)."""

    def timed(self, stage: str, description: str) -> AbstractContextManager[None]:
        """Time a stage of the request, for the client to see where its time went."""
        ...

    async def unless_gone(self, work: Awaitable[T]) -> T:
        """``work``'s result, unless the client leaves first: then the work is cancelled (its
        queued items are dropped) and this raises."""
        ...


async def submit(
    client: Client,
    queue: RequestQueue[Any, Any],
    items: Sequence[Any],
    costs: Sequence[int],
    timeout_s: float,
    stage: tuple[str, str],
) -> list[Any]:
    """Every item's result or exception, in order, timed as ``stage`` (name, description)."""
    with client.timed(*stage):
        return await client.unless_gone(queue.submit(items, timeout_s, costs)) if items else []


def all_or_nothing(results: Sequence[R | Exception], field: str) -> list[R]:
    """All results, or the request's error: 422 naming every text that is too long (or whose
    decoding could never fit the decode memory budget), else 500."""
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
    if not failed:  # the usual case: one pass
        return list(results)  # type: ignore[arg-type]  # no exception among them
    refused = [(i, r) for i, r in failed if isinstance(r, TextTooLong | DecodeTooLarge)]
    if refused:
        raise InvalidRequest(
            [
                problem(
                    "text_too_long" if isinstance(r, TextTooLong) else "decode_too_large",
                    (field, i),
                    str(r),
                    r.limit,
                )
                for i, r in refused
            ]
        )
    i, error = failed[0]
    if isinstance(error, EngineFailure):
        raise InternalError(str(error)) from error
    raise InternalError(f"{field}[{i}] failed: {type(error).__name__}") from error
