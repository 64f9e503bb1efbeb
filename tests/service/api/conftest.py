"""The app with small NumPy engines, its lifespan running, behind an in-process httpx client."""

from __future__ import annotations

import asyncio
import atexit
import itertools
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import REGISTRY

from service.engine.base import Engine
from service.http.app import create_app
from service.settings import Settings
from tests.service.small_engines import HashEmbedder, ReverseTranslator

_names = itertools.count()
_OWN_GLOSSARY_DIR = "tserve-glossaries-"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


_own_glossary_dirs: list[Path] = []  # small_settings' own, removed when the test process ends


@atexit.register
def _remove_own_glossary_dirs() -> None:
    for directory in _own_glossary_dirs:
        shutil.rmtree(directory, ignore_errors=True)


def small_settings(**overrides: Any) -> Settings:
    own = Path(tempfile.gettempdir()) / f"{_OWN_GLOSSARY_DIR}{uuid.uuid4().hex}"
    _own_glossary_dirs.append(own)
    values: dict[str, Any] = {
        "auto_export": False,
        "max_wait_ms": 1.0,
        "request_timeout_s": 5.0,
        "max_items_per_request": 8,
        "max_chars_per_text": 200,
        "max_queue": 64,
        "max_body_bytes": 4096,
        # one worker per model: queueing is a matter of design here
        "express_max_tokens": 0,
        "worker_threads": 1,
        # a directory of its own, made only when a glossary is created: never the checkout's
        "glossary_dir": own,
        **overrides,
    }
    return Settings.model_validate(values)


@dataclass
class Served:
    app: FastAPI
    client: httpx.AsyncClient
    embedder: HashEmbedder
    translator: ReverseTranslator


def engines(**hooks: Any) -> tuple[HashEmbedder, ReverseTranslator]:
    """A fresh pair with unique names, so metric deltas belong to one test."""
    n = next(_names)
    return HashEmbedder(name=f"embed-{n}", **hooks), ReverseTranslator(name=f"translate-{n}", **hooks)


@asynccontextmanager
async def serving(
    settings: Settings | None = None,
    given: Mapping[str, Engine] | Sequence[Engine] | None = None,
    *,
    wait_ready: bool = True,
    **hooks: Any,
) -> AsyncIterator[Served]:
    """The app over ``given`` engines (by task, or a list: ``translator`` is then the first
    translation engine), or over a fresh small pair built with ``hooks``."""
    embedder, translator = engines(**hooks)
    if given is None:
        given = {"embed": embedder, "translate": translator}
    settings = settings or small_settings()
    app = create_app(settings, given)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            if wait_ready:
                await until_ready(client)
            by_task = given if isinstance(given, Mapping) else {e.manifest.task: e for e in reversed(given)}
            served_embedder = by_task.get("embed", embedder)
            served_translator = by_task.get("translate", translator)
            assert isinstance(served_embedder, HashEmbedder) and isinstance(
                served_translator, ReverseTranslator
            )
            yield Served(app, client, served_embedder, served_translator)


async def until_ready(client: httpx.AsyncClient, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (await client.get("/health/ready")).status_code != 200:
        assert time.monotonic() < deadline, "the app never became ready"
        await asyncio.sleep(0.01)


async def eventually(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.005)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert error["type"] and error["message"]
    return error


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serving() as s:
        yield s
