"""A client that leaves while its request is queued: its items never reach the engine."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import MutableMapping
from typing import Any

import pytest

from tests.service.api.conftest import eventually, metric, serving

pytestmark = pytest.mark.anyio


async def test_a_disconnected_client_s_queued_work_is_dropped_and_counted() -> None:
    gate = threading.Event()
    async with serving(gate=gate) as s:
        name = s.embedder.manifest.name
        queue = s.app.state.runtime.embedding_model.queue
        before = metric("tserve_dropped_total", model=name, reason="disconnected")
        answered_499 = metric("tserve_requests_total", endpoint="/v1/embed", status="499")
        try:
            busy = asyncio.ensure_future(s.client.post("/v1/embed", json={"texts": ["busy"]}))
            await eventually(lambda: len(s.embedder.hooks.batches) == 1)  # the worker is held

            # A raw ASGI request whose client disconnects once its texts are queued.
            body = json.dumps({"texts": ["gone one", "gone two", "gone three"]}).encode()
            leave = asyncio.Event()
            messages: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]
            sent: list[MutableMapping[str, Any]] = []

            async def receive() -> dict[str, Any]:
                if messages:
                    return messages.pop(0)
                await leave.wait()
                return {"type": "http.disconnect"}

            async def send(message: MutableMapping[str, Any]) -> None:
                sent.append(message)

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": "/v1/embed",
                "raw_path": b"/v1/embed",
                "query_string": b"",
                "root_path": "",
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
                "client": ("127.0.0.1", 5000),
                "server": ("test", 80),
            }
            call = asyncio.ensure_future(s.app(scope, receive, send))
            await eventually(lambda: queue.queued == 3)
            leave.set()
            await asyncio.wait_for(call, 5)

            assert queue.queued == 0
            assert metric("tserve_dropped_total", model=name, reason="disconnected") - before == 3
            assert sent[0]["status"] == 499  # only the metrics see it
            assert metric("tserve_requests_total", endpoint="/v1/embed", status="499") - answered_499 == 1
        finally:
            gate.set()
        assert (await busy).status_code == 200
        assert (await s.client.post("/v1/embed", json={"texts": ["after"]})).status_code == 200
        assert all(not text.startswith("gone") for batch in s.embedder.hooks.batches for text in batch)
