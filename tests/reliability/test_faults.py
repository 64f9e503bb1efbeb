"""Faults: broken artefacts, an onnxruntime failure in one batch, SIGTERM under load, and a client
that leaves while queued; over real HTTP wherever that is where the fault lives.

Already proven elsewhere and not repeated: the loader names a missing, corrupted or unloadable
file (tests/service/engine/test_loader.py); missing artefacts without auto-export exit 1
(tests/service/api/test_api_shutdown.py); one request whose batch crashes in a NumPy engine gets
500 (tests/service/api/test_api_errors.py); SIGTERM with one slow request in flight drains and
exits 0 (test_api_shutdown.py); a disconnect delivered as an ASGI message drops the queued items
(tests/service/api/test_api_disconnect.py).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from service.engine.base import Embedding, EmbedItem, Encoded, Engine
from service.engine.embedder import OnnxEmbedder
from service.engine.loader import load_engine
from service.engine.session import SessionConfig
from service.http.app import create_app
from tests.reliability.load import Outcome, Request, run_load, statuses
from tests.servers import (
    ROOT,
    ServerProcess,
    artefact_env,
    free_port,
    server_env,
    server_process,
    service_command,
    small_server_command,
)
from tests.service.api.conftest import error_of, eventually, metric, small_settings, until_ready

# ---- broken artefacts ------------------------------------------------------------------------


def _break(root: Path, model: str, file: str, how: str) -> Path:
    """A private copy of ``model`` with ``file`` removed or one byte flipped; the file's path."""
    link = root / model
    real = link.resolve()
    link.unlink()
    shutil.copytree(real, link)
    path = link / "fp32" / file
    if how == "missing":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    return path


def _served_copy(artefact_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "artefacts"
    root.mkdir()
    for link in artefact_root.iterdir():
        (root / link.name).symlink_to(link.resolve(), target_is_directory=True)
    return root


BROKEN = [
    ("tiny-bert", "tokenizer.json", "missing"),
    ("tiny-en-de", "decoder.onnx", "corrupted"),
    ("tiny-en-de", "manifest.json", "corrupted"),
]


@pytest.mark.parametrize("model, file, how", BROKEN, ids=[f"{h}-{m}-{f}" for m, f, h in BROKEN])
def test_the_service_refuses_to_start_on_a_broken_artefact_naming_the_file(
    artefact_root: Path, tmp_path: Path, model: str, file: str, how: str
) -> None:
    root = _served_copy(artefact_root, tmp_path)
    path = _break(root, model, file, how)
    done = subprocess.run(
        service_command(),
        cwd=ROOT,
        env=server_env(free_port(), artefact_env(root)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert str(path) in output, output


@pytest.mark.anyio
async def test_without_an_exit_hook_a_broken_artefact_leaves_the_service_not_ready_naming_it(
    artefact_root: Path, tmp_path: Path
) -> None:
    root = _served_copy(artefact_root, tmp_path)
    path = _break(root, "tiny-bert", "encoder.onnx", "corrupted")
    settings = small_settings(
        artefact_root=str(root),
        translate_model="tiny-en-de",
        embed_model="tiny-bert",
        variant="fp32",
        provider="cpu",
        intra_op_threads=1,
    )
    app = create_app(settings)
    async with _client(app, wait_ready=False) as client:
        await eventually(lambda: app.state.runtime.state == "failed", timeout_s=60)
        ready = await client.get("/health/ready")
        assert ready.status_code == 503 and str(path) in ready.json()["detail"]
        r = await client.post("/v1/embed", json={"texts": ["hello"]})
        assert r.status_code == 503 and str(path) in error_of(r)["message"]
        assert (await client.get("/health/live")).status_code == 200


# ---- an onnxruntime failure in one batch -----------------------------------------------------


class _BreakableSession:
    """An onnxruntime session whose next run can be handed token ids of the wrong dtype: the
    failure is onnxruntime's own (InvalidArgument), raised inside the engine's call."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.break_next = False

    def run(self, outputs: Any, feeds: dict[str, np.ndarray], *args: Any) -> Any:
        if self.break_next:
            self.break_next = False
            feeds = {name: array.astype(np.float32) for name, array in feeds.items()}
        return self._session.run(outputs, feeds, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class FaultyEmbedder:
    """The real ``OnnxEmbedder``, recording each batch; holds the first batch until released,
    and breaks onnxruntime's run of batch number ``fail_batch`` (1-based)."""

    def __init__(self, engine: OnnxEmbedder, fail_batch: int) -> None:
        self.engine = engine
        self.manifest = engine.manifest
        self.provider = engine.provider
        self.session = _BreakableSession(engine.session)
        engine.session = self.session
        self.fail_batch = fail_batch
        self.batches: list[list[str]] = []
        self.release = threading.Event()

    def count_tokens(self, text: str) -> int:
        return self.engine.count_tokens(text)

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        return self.engine.encode(texts)

    def warmup(self) -> None:
        self.engine.warmup()

    def embed(self, items: list[EmbedItem]) -> list[Embedding | Exception]:
        self.batches.append([item.text for item in items])
        if len(self.batches) == 1:
            assert self.release.wait(30), "never released"
        self.session.break_next = len(self.batches) == self.fail_batch
        return self.engine.embed(items)


@asynccontextmanager
async def _client(app: FastAPI, *, wait_ready: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            if wait_ready:
                await until_ready(client, timeout_s=30)
            yield client


@pytest.mark.anyio
async def test_an_onnxruntime_failure_fails_exactly_its_batch_and_the_service_goes_on(
    embedding_artefact: Path,
) -> None:
    batch = 4
    engine = load_engine(embedding_artefact, SessionConfig("cpu", 1), max_batch_size=batch)
    assert isinstance(engine, OnnxEmbedder)
    faulty = FaultyEmbedder(engine, fail_batch=2)
    given: dict[str, Engine] = {"embed": faulty}
    app = create_app(small_settings(max_batch_size=batch, max_items_per_request=batch), given)
    async with _client(app) as client:
        name = faulty.manifest.name
        errors_before = metric("tserve_item_errors_total", model=name)

        async def embed(text: str) -> tuple[str, httpx.Response]:
            return text, await client.post("/v1/embed", json={"texts": [text]})

        first = asyncio.ensure_future(embed("the first one"))
        await eventually(lambda: len(faulty.batches) == 1)  # held in the engine
        texts = [f"request number {i} of twelve" for i in range(3 * batch)]
        rest = [asyncio.ensure_future(embed(text)) for text in texts]
        await eventually(lambda: app.state.runtime.embedding_model.queue.queued == len(texts))
        faulty.release.set()
        results = dict(await asyncio.gather(first, *rest))

        failed = set(faulty.batches[1])
        assert len(faulty.batches) == 4 and len(failed) == batch, faulty.batches
        for text, r in results.items():
            if text in failed:
                assert r.status_code == 500, r.text
                error = error_of(r)
                assert error["type"] == "internal_error" and error["request_id"] == r.headers["X-Request-ID"]
            else:
                assert r.status_code == 200, r.text
        assert metric("tserve_item_errors_total", model=name) - errors_before == batch

        after = await client.post("/v1/embed", json={"texts": ["after the failure", "and another"]})
        assert after.status_code == 200 and len(after.json()["embeddings"]) == 2
        assert (await client.get("/health/ready")).status_code == 200


# ---- SIGTERM under load ----------------------------------------------------------------------


def test_sigterm_under_load_finishes_in_flight_requests_refuses_new_ones_and_exits_0(tmp_path: Path) -> None:
    settings = {
        "TSERVE_DRAIN_DELAY_S": "1.5",
        "TSERVE_SHUTDOWN_GRACE_S": "20",
        "TSERVE_LOG_LEVEL": "info",
    }
    margin = 0.5  # around the signal: a request just before it may be refused, one just after served
    with server_process(small_server_command(4 * margin), settings, tmp_path / "server.log") as server:
        stop = threading.Event()
        outcomes: list[Outcome] = []

        def load() -> None:
            asyncio.run(run_load(server.url, _request, 10**6, 8, stop=stop.is_set, outcomes=outcomes))

        loader = threading.Thread(target=load)
        loader.start()
        # Two rounds served, and every connection with one in flight (+1: this scrape), sent well
        # before the signal.
        _wait(lambda: len(outcomes) >= 16 and server.metric("tserve_inflight_requests") >= 9, "the load")
        time.sleep(2 * margin)
        signalled = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(margin)  # within the drain delay: new requests still come, as from a slow balancer
        for path, body in (_request(0), _request(1)):
            refused = httpx.post(f"{server.url}{path}", json=body, timeout=10)
            assert refused.status_code == 503 and error_of(refused)["type"] == "shutting_down"
        stop.set()
        loader.join(60)
        assert not loader.is_alive()
        assert server.proc.wait(30) == 0

        print(f"SIGTERM under load: {dict(statuses(outcomes))}")
        lost = [o for o in outcomes if o.status is None]
        assert not lost, lost[:3]
        assert set(statuses(outcomes)) <= {200, 503}, statuses(outcomes)
        before = [o for o in outcomes if o.started < signalled - margin]
        after = [o for o in outcomes if o.started > signalled + margin]
        assert before and {o.status for o in before} == {200}
        assert all(o.status == 503 and b'"shutting_down"' in o.body for o in after)
        finished_during_drain = [o for o in before if o.started + o.seconds > signalled]
        assert finished_during_drain, "nothing was in flight at the signal"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/health/live", timeout=2)


def _request(i: int) -> Request:
    return ("/v1/embed", {"texts": [f"load {i}"]}) if i % 2 else ("/v1/translate", {"text": f"load {i}"})


# ---- a client that leaves while queued -------------------------------------------------------


def _queued(server: ServerProcess) -> float:
    return server.metric("tserve_queue_depth", model="small-embed")


def test_a_client_closing_its_connection_while_queued_has_its_work_dropped_and_counted(
    tmp_path: Path,
) -> None:
    # one worker and no express one: else the small request runs beside the busy one
    one_worker = {"TSERVE_EXPRESS_MAX_TOKENS": "0", "TSERVE_WORKER_THREADS": "1"}
    with server_process(small_server_command(1.0), one_worker, tmp_path / "server.log") as server:
        dropped = server.metric("tserve_dropped_total", model="small-embed", reason="disconnected")
        computed = server.metric("tserve_batch_size_sum", model="small-embed")
        busy: list[httpx.Response] = []
        holder = threading.Thread(
            target=lambda: busy.append(
                httpx.post(f"{server.url}/v1/embed", json={"texts": ["busy"]}, timeout=30)
            )
        )
        holder.start()
        _wait(lambda: server.metric("tserve_batch_size_count", model="small-embed") >= 1, "the busy batch")

        body = b'{"texts": ["gone one", "gone two", "gone three"]}'
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as leaving:
            leaving.sendall(
                b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            _wait(lambda: _queued(server) == 3, "the three texts queued")
        _wait(
            lambda: (
                server.metric("tserve_dropped_total", model="small-embed", reason="disconnected") - dropped
                == 3
            ),
            "the drop",
        )
        assert _queued(server) == 0
        holder.join(30)
        assert busy[0].status_code == 200
        r = httpx.post(f"{server.url}/v1/embed", json={"texts": ["after"]}, timeout=30)
        assert r.status_code == 200
        # Only "busy" and "after" were computed: the three were dropped before inference.
        assert server.metric("tserve_batch_size_sum", model="small-embed") - computed == 2
        assert server.metric("tserve_requests_total", endpoint="/v1/embed", status="499") >= 1


def _wait(condition: Any, what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
