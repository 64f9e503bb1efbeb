"""The serving layer over a started ``Runtime`` of small NumPy engines, without HTTP."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import pytest

from service.engine.base import Engine
from service.serving.runtime import Runtime
from service.serving.startup import start
from tests.service.api.conftest import small_settings
from tests.service.small_engines import ReverseTranslator

T = TypeVar("T")

_runs = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def translator(pair: str, **hooks: Any) -> ReverseTranslator:
    """A ReverseTranslator for ``pair`` ("en-de"), named uniquely (metrics are global)."""
    source, target = pair.split("-")
    return ReverseTranslator(
        name=f"serving-{next(_runs)}-{pair}", source_languages=(source,), target_languages=(target,), **hooks
    )


@asynccontextmanager
async def started(*engines: Engine, **settings: Any) -> AsyncIterator[Runtime]:
    """A runtime serving ``engines`` (loaded, warmed up, each with its queue), closed after."""
    runtime = Runtime(small_settings(**settings))
    await start(runtime, list(engines))
    assert runtime.state == "ready", runtime.detail
    try:
        yield runtime
    finally:
        await runtime.close(1.0)


class InProcessClient:
    """The serving layer's ``Client`` for a caller in this process: it records the stages the
    request went through and never leaves (unless told to, before the work starts)."""

    def __init__(self, gone: bool = False) -> None:
        self.stages: list[str] = []
        self.gone = gone

    @contextmanager
    def timed(self, stage: str, description: str) -> Iterator[None]:
        self.stages.append(stage)
        yield

    async def unless_gone(self, work: Awaitable[T]) -> T:
        task = asyncio.ensure_future(work)
        if self.gone:
            task.cancel()
        return await task
