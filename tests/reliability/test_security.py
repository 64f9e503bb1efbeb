"""Security: API keys (constant-time, every key compared, odd headers), the body limit before the
body arrives, CORS off unless configured, metric labels that clients cannot grow, and the
service running as the container runs it (uid 10001, to which its own files are read-only).

Covered elsewhere and not repeated: 401/403 on every model route and the exempt probes,
/metrics and docs (tests/service/api/test_api_errors.py: /metrics stays open because Prometheus
scrapes it without a key and its labels carry no client data, see below); 413 by Content-Length
and while streaming in-process (test_api_errors.py) and over HTTP (test_bad_inputs.py); CORS
preflight on and off (test_api_errors.py); the images' USER 10001 and the Kubernetes
securityContext (runAsNonRoot, readOnlyRootFilesystem, no capabilities:
tests/deploy/test_deploy_docker.py, test_deploy_k8s.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import ROOT, ServerProcess, artefact_env, server_process
from tests.service.api.conftest import error_of, serving, small_settings

pytestmark = pytest.mark.anyio

KEYS = ["key-one", "key-two", "key-three"]


async def test_every_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    original = secrets.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr("service.serving.access.secrets.compare_digest", spy)
    async with serving(small_settings(api_keys=KEYS)) as s:
        for given, status in (("key-one", 200), ("key-three", 200), ("key-on", 403), ("key-one2", 403)):
            compared.clear()
            r = await s.client.post(
                "/v1/embed", json={"texts": ["x"]}, headers={"Authorization": f"Bearer {given}"}
            )
            assert r.status_code == status
            # No early exit on a match or a mismatch: the time says nothing about which key matched.
            assert sorted(b for _, b in compared) == sorted(k.encode() for k in KEYS)


@pytest.mark.parametrize(
    "authorization, status",
    [
        (b"Basic a2V5LW9uZTo=", 401),  # another scheme
        (b"Bearer", 401),
        (b"Bearer ", 401),
        (b"key-one", 401),  # no scheme
        (b"bearer key-one", 200),  # schemes are case-insensitive
        (b"Bearer key-one extra", 403),
        (b"Bearer KEY-ONE", 403),  # keys are not
        (b"Bearer \xff\xfe", 403),  # not UTF-8 (headers are latin-1)
        (b"Bearer " + b"k" * 8000, 403),
    ],
    ids=["basic", "bare-scheme", "empty", "no-scheme", "lowercase", "extra", "case", "latin-1", "8k"],
)
async def test_odd_authorization_headers_are_401_or_403_never_5xx(authorization: bytes, status: int) -> None:
    async with serving(small_settings(api_keys=KEYS)) as s:
        r = await s.client.post("/v1/embed", json={"texts": ["x"]}, headers={b"Authorization": authorization})
        assert r.status_code == status, r.text
        if status != 200:
            error = error_of(r)
            assert "key-" not in error["message"]  # never echoes a key
            assert s.embedder.hooks.batches == []


def test_a_huge_declared_body_is_refused_before_it_is_sent(small_server: ServerProcess) -> None:
    """Content-Length of 10 GB and no body: 413 at once, the connection closed."""
    host, port = small_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000000\r\n\r\n"
        )
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"connection: close" in head.lower()
    assert b'"body_too_large"' in body


PREFLIGHT = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}


async def test_cors_is_off_by_default_for_every_kind_of_cross_origin_request() -> None:
    async with serving() as s:
        origin = {"Origin": "https://evil.example"}
        answers = [
            await s.client.post("/v1/embed", json={"texts": ["x"]}, headers=origin),
            await s.client.get("/v1/models", headers=origin),
            await s.client.get("/health/ready", headers=origin),
            await s.client.options("/v1/embed", headers={**PREFLIGHT, **origin}),
        ]
        for r in answers:
            assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers


async def test_cors_when_configured_allows_only_the_listed_origins() -> None:
    async with serving(small_settings(cors_origins=["https://app.example"])) as s:
        allowed = await s.client.post(
            "/v1/embed", json={"texts": ["x"]}, headers={"Origin": "https://app.example"}
        )
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert "X-Request-ID" in allowed.headers["access-control-expose-headers"]
        assert "access-control-allow-credentials" not in allowed.headers
        other = await s.client.post(
            "/v1/embed", json={"texts": ["x"]}, headers={"Origin": "https://evil.example"}
        )
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
        refused = await s.client.options("/v1/embed", headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in refused.headers


def _series(text: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    return {
        (sample.name, frozenset(sample.labels.items()))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("tserve_")
    }


async def test_clients_cannot_grow_the_metric_label_sets() -> None:
    """Random paths, methods, headers, model names and languages: the series set stops growing
    after the first round, and no client-sent value appears in /metrics."""
    async with serving(small_settings(api_keys=KEYS)) as s:
        sent: list[str] = []

        async def round_of(n: int) -> None:
            for _ in range(n):
                token = secrets.token_hex(6)
                sent.append(token)
                headers = {
                    "X-Request-ID": f"id-{token}",
                    "X-Model": token,
                    "User-Agent": f"agent-{token}",
                    "Authorization": f"Bearer {KEYS[0] if len(sent) % 2 else token}",
                }
                await s.client.get(f"/{token}/v1/embed?model={token}", headers=headers)
                await s.client.request("PROPFIND", f"/v1/{token}", headers=headers)
                await s.client.post(f"/v1/embed/{token}", json={"texts": [token]}, headers=headers)
                await s.client.post("/v1/embeddings", json={"input": token, "model": token}, headers=headers)
                await s.client.post(
                    "/v1/translate", json={"text": token, "target_language": token[:3]}, headers=headers
                )
                await s.client.post("/v1/translate", json={"text": token, "beam_size": 1}, headers=headers)

        await s.client.get("/metrics")  # its own series appear after its first answer
        earlier = _series((await s.client.get("/metrics")).text)  # other tests' (one registry)
        await round_of(5)
        first = _series((await s.client.get("/metrics")).text)
        await round_of(50)
        text = (await s.client.get("/metrics")).text
        assert _series(text) == first
        assert not [token for token in sent if token in text]
        endpoints = {dict(labels).get("endpoint") for _, labels in first - earlier} - {None}
        templates = {*s.app.openapi()["paths"], "/metrics", "other"}
        assert endpoints <= templates, endpoints - templates


def test_the_compose_service_runs_read_only_without_capabilities() -> None:
    """What tests/deploy checks for Kubernetes, for docker compose (whose test checks the rest)."""
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]["tserve"]
    assert compose["read_only"] is True
    assert compose["tmpfs"] == ["/tmp"]
    assert compose["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in compose["security_opt"]


CONTAINER_UID = 10001  # docker/Dockerfile's USER


@pytest.fixture
def world_readable_artefacts(artefact_root: Path) -> Iterator[Path]:
    """The tiny models copied where another user can read them (pytest's tmp dirs are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="tserve-artefacts-"))
    try:
        for link in artefact_root.iterdir():
            shutil.copytree(link.resolve(), root / link.name)
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_the_service_runs_as_the_container_user_writing_nothing_of_its_own(
    world_readable_artefacts: Path, tmp_path: Path
) -> None:
    """As uid 10001 every file of the checkout, the virtualenv and the artefacts is read-only (they
    belong to root), as in the image; HOME=/tmp as there. The real models load and serve."""
    command = [
        "setpriv",
        f"--reuid={CONTAINER_UID}",
        f"--regid={CONTAINER_UID}",
        "--clear-groups",
        sys.executable,
        "-m",
        "service",
    ]
    env = {**artefact_env(world_readable_artefacts), "HOME": "/tmp"}
    app_factory = ROOT / "service" / "http" / "app.py"
    for path in (app_factory, Path(sys.executable), *world_readable_artefacts.rglob("*")):
        owner = path.resolve().stat()
        assert owner.st_uid != CONTAINER_UID and not owner.st_mode & (stat.S_IWGRP | stat.S_IWOTH), path
    with server_process(command, env, tmp_path / "server.log") as server:
        assert psutil.Process(server.proc.pid).uids().effective == CONTAINER_UID
        translated = httpx.post(f"{server.url}/v1/translate", json={"text": "a man rides"}, timeout=30)
        assert translated.status_code == 200, translated.text
        embedded = httpx.post(f"{server.url}/v1/embed", json={"texts": ["a man rides"]}, timeout=30)
        assert embedded.status_code == 200, embedded.text
        server.proc.terminate()
        assert server.proc.wait(30) == 0
