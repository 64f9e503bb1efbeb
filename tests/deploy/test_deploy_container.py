"""The CPU image, built and run: what a user of `docker run` / `podman run` gets.

Built by docker/build.sh (docker where an engine answers, else podman) from this repository,
started with host networking on a free port, and checked against `python -m service` serving
the same models from a local export: same translations, same embedding, readiness, metrics,
the user, no torch, the HEALTHCHECK, and the drain on SIGTERM; and its environment as the deps
stage made it: every module of `service` imports, and without artefacts the service exits 1.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from containers import (
    Build,
    Engine,
    translate_and_embed,
    wait_for_status,
)
from deploy_helpers import REPO

from service.artefacts import sha256_of_files
from tests.e2e.real_models import served_env, start_service
from tests.servers import ServerProcess, free_port

pytestmark = pytest.mark.slow

START_PERIOD_S = 180  # the Dockerfile's HEALTHCHECK --start-period
DRAIN_DELAY_S = 3
SHUTDOWN_GRACE_S = 10


class Container:
    def __init__(self, engine: Engine, name: str, port: int) -> None:
        self.engine, self.name, self.url = engine, name, f"http://127.0.0.1:{port}"

    def running(self) -> bool:
        state = self.engine("inspect", "--format", "{{.State.Running}}", self.name)
        return state.returncode == 0 and state.stdout.strip() == "true"

    def exec(self, *command: str) -> str:
        return self.engine.ok("exec", self.name, *command)

    def logs(self) -> str:
        done = self.engine("logs", self.name)
        return (done.stdout + done.stderr)[-5000:]


@pytest.fixture(scope="module")
def container(engine: Engine, cpu_image: Build) -> Iterator[Container]:
    """The image as a user runs it, on a free port; its logs printed on the way out."""
    port = free_port()
    name = f"tserve-test-{uuid.uuid4().hex[:8]}"
    engine.ok(
        "run", "--detach", "--name", name, "--network", "host",
        "--env", f"TSERVE_PORT={port}",
        "--env", f"TSERVE_DRAIN_DELAY_S={DRAIN_DELAY_S}",
        "--env", f"TSERVE_SHUTDOWN_GRACE_S={SHUTDOWN_GRACE_S}",
        cpu_image.image,
    )  # fmt: skip
    box = Container(engine, name, port)
    try:
        seconds = wait_for_status(f"{box.url}/health/ready", 200, START_PERIOD_S, alive=box.running)
        print(f"{name}: ready {seconds:.1f} s after start")
        yield box
    finally:
        print(box.logs())
        engine("rm", "--force", name, timeout=60)


@pytest.fixture(scope="module")
def local_service(
    default_artefacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """`python -m service` on a local export of the default models, with the image's variant
    choice (auto: int8 on the CPU) — the reference the container must match."""
    env = served_env(default_artefacts, "auto", TSERVE_CPU_VARIANT="int8")
    yield from start_service(tmp_path_factory, "service-like-image", env)


def test_the_image_answers_as_the_service_does(container: Container, local_service: ServerProcess) -> None:
    served_translations, served_embeddings = translate_and_embed(container.url)
    local_translations, local_embeddings = translate_and_embed(local_service.url)
    assert served_translations == local_translations
    assert all(text.strip() for text in served_translations)
    np.testing.assert_allclose(served_embeddings, local_embeddings, rtol=0, atol=1e-5)


def test_metrics(container: Container) -> None:
    answer = httpx.get(f"{container.url}/metrics", timeout=10)
    assert answer.status_code == 200
    series = [line for line in answer.text.splitlines() if line.startswith("tserve_")]
    assert any(line.startswith("tserve_requests_total") for line in series), series[:20]


def test_runs_as_uid_10001_without_torch(container: Container) -> None:
    assert container.exec("id", "-u").strip() == "10001"
    probe = "import importlib.util as u; print([u.find_spec(m) is None for m in ('torch', 'transformers')])"
    assert container.exec("python", "-c", probe).strip() == "[True, True]"


def test_healthcheck_reports_healthy(engine: Engine, container: Container) -> None:
    def health() -> str:
        return engine.ok("inspect", "--format", "{{.State.Health.Status}}", container.name).strip()

    if engine.name == "podman":
        # podman runs HEALTHCHECKs from systemd timers, which a machine without systemd lacks:
        # run the image's check command once, as the timer would.
        done = engine("healthcheck", "run", container.name, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        status = health()
    else:
        deadline = time.monotonic() + 60
        while (status := health()) != "healthy" and time.monotonic() < deadline:
            time.sleep(1)
    assert status == "healthy"


def test_sigterm_drains_then_exits_0(engine: Engine, container: Container) -> None:
    """Last in this module: it stops the container."""
    engine.ok("kill", "--signal", "TERM", container.name)
    wait_for_status(f"{container.url}/health/ready", 503, DRAIN_DELAY_S + 2)
    waited = engine("wait", container.name, timeout=DRAIN_DELAY_S + SHUTDOWN_GRACE_S + 15)
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.strip() == "0", f"exit code {waited.stdout.strip()}\n{container.logs()}"


# Every module of `service`, imported in the image's environment (`pip install .` without the
# checkpoint, the deps stage): a dependency the project does not declare would crash the image at
# start. Run with no models (the entry point's own message in this case is the next test's).
IMPORT_EVERY_MODULE = (
    "import importlib, importlib.util, pkgutil, sys, service\n"
    "assert importlib.util.find_spec('torch') is None, 'torch installed'\n"
    "for m in pkgutil.walk_packages(service.__path__, 'service.'):\n"
    "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
    "assert 'torch' not in sys.modules\n"
    "print('ok')\n"
)


def test_every_module_of_the_service_imports_in_the_image_without_torch(
    engine: Engine, cpu_image: Build
) -> None:
    ran = engine("run", "--rm", "--entrypoint", "python", cpu_image.image, "-c", IMPORT_EVERY_MODULE)
    assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stdout[-3000:] + ran.stderr[-3000:]


def test_without_artefacts_the_image_exits_1_naming_them(engine: Engine, cpu_image: Build) -> None:
    """TSERVE_AUTO_EXPORT=false (the image's) and an empty artefact root: the service must not
    start, and say where it looked."""
    ran = engine("run", "--rm", "--env", "TSERVE_ARTEFACT_ROOT=/tmp/no-artefacts", cpu_image.image)
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "/tmp/no-artefacts" in ran.stdout + ran.stderr


def test_image_layout(engine: Engine, cpu_image: Build) -> None:
    """What the image declares: the user, the port, the healthcheck (docker format, which OCI
    drops), and an /app that exists (a read-only root cannot create its working directory)."""
    inspected = json.loads(engine.ok("image", "inspect", cpu_image.image))[0]
    config = inspected["Config"]
    assert config["User"] == "10001:10001"
    assert config["WorkingDir"] == "/app"
    assert "8000/tcp" in config["ExposedPorts"]
    healthcheck = config.get("Healthcheck") or inspected["Healthcheck"]  # docker's place, podman's
    assert "/health/ready" in " ".join(healthcheck["Test"])
    assert healthcheck["StartPeriod"] == START_PERIOD_S * 10**9
    listed = engine.ok("run", "--rm", "--read-only", "--entrypoint", "ls", cpu_image.image, "-d", "/app")
    assert listed.strip() == "/app"


def test_artefacts_in_the_image_come_from_the_repository(engine: Engine, cpu_image: Build) -> None:
    """Each model's int8 manifest in the image names the same source checkpoint as the repo's."""
    for model in ("transformer-en-de", "transformer-de-en"):
        path = f"/artefacts/{model}/int8/manifest.json"
        manifest = json.loads(engine.ok("run", "--rm", "--entrypoint", "cat", cpu_image.image, path))
        checkpoint = REPO / "export" / "checkpoints" / model / "model.safetensors"
        assert manifest["source"]["sha256"] == sha256_of_files([checkpoint]), model
