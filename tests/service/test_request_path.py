"""One translate request, from its route to the engine, passes through each module at most twice.

Every call the request makes in the service's modules is traced (on the event loop and on the
engine's threads), and each call stack is read as the modules it goes through, consecutive
frames of one module counted once: ``api.translate → serving.translation → queue.requests →
serving.translation`` passes through ``serving.translation`` twice. A third pass means a layer
calls back into one it already left, the tangle a reader cannot follow.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest

from service.engine.loader import load_engine
from service.http.app import create_app
from tests.service.api.conftest import small_settings, until_ready

MOST_PASSES = 2


def modules_on(frame: FrameType | None) -> tuple[str, ...]:
    """The service's modules of the stack ending at ``frame``, outermost first, consecutive
    frames of one module once."""
    modules: list[str] = []
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("service.") and (not modules or modules[-1] != module):
            modules.append(module)
        frame = frame.f_back
    return tuple(reversed(modules))


@contextmanager
def traced_stacks() -> Iterator[set[tuple[str, ...]]]:
    """Each distinct stack of service modules that a call was made from, on every thread."""
    stacks: set[tuple[str, ...]] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            stacks.add(modules_on(frame))

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield stacks
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def over_passes(stacks: set[tuple[str, ...]]) -> list[str]:
    """Each stack that passes through a module more than ``MOST_PASSES`` times."""
    return sorted(
        " → ".join(m.removeprefix("service.") for m in stack)
        for stack in stacks
        if stack and max(Counter(stack).values()) > MOST_PASSES
    )


def test_the_count_sees_a_third_pass() -> None:
    stacks = {("service.a", "service.b", "service.a", "service.c", "service.a"), ("service.a", "service.b")}
    assert over_passes(stacks) == ["a → b → a → c → a"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize("batching", ["continuous", "batch"])
async def test_a_translate_request_passes_each_module_at_most_twice(
    translation_artefact: Path, batching: str
) -> None:
    app = create_app(small_settings(translate_batching=batching), [load_engine(translation_artefact)])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await until_ready(client)
            with traced_stacks() as stacks:
                response = await client.post("/v1/translate", json={"text": "a b c. d e f."})
    assert response.status_code == 200, response.text
    assert any("service.engine.translation.translator" in s for s in stacks)  # the trace reached the engine
    assert not over_passes(stacks), "\n".join(over_passes(stacks))
