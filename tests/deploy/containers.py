"""The container engine of the image and pod tests: docker where an engine answers, else podman
(docker/build.sh decides, and builds; .ci/install-tools.sh installs podman where apt-get can).

The images are built from the repository as it is (layers cached by the engine between runs),
tagged as the k8s overlays name them, so the pod test runs the image the container test checked.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from deploy_helpers import REPO, run

from tests.background import BackgroundProcess

if TYPE_CHECKING:  # real_models imports the export's packages, which a deploy check may lack
    from tests.e2e.real_models import DefaultArtefacts

BUILD_SCRIPT = REPO / "docker" / "build.sh"
SEEDED_BUILD = Path(__file__).with_name("seeded_build.py")
BUILD_TIMEOUT_S = 1800  # from its start: the wait for the default models' export, then the build
VERSION = next(
    line.split('"')[1]
    for line in (REPO / "pyproject.toml").read_text().splitlines()
    if line.startswith("version = ")
)
CPU_IMAGE = f"tserve:{VERSION}-cpu"  # k8s/overlays/cpu's image


@dataclass(frozen=True)
class Engine:
    """One container engine CLI and the environment docker/build.sh runs it with."""

    name: str
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run([self.name, *args], timeout=timeout, env=self.env)

    def ok(self, *args: str, timeout: float = 120) -> str:
        done = self(*args, timeout=timeout)
        output = done.stdout[-3000:] + done.stderr[-3000:]
        assert done.returncode == 0, f"{self.name} {' '.join(args)}:\n{output}"
        return done.stdout


def find_engine() -> Engine:
    """The engine docker/build.sh picks here, or skip saying how to get one."""
    engine, missing = engine_here()
    if engine is None:
        pytest.skip(missing)
    return engine


@functools.cache
def engine_here() -> tuple[Engine | None, str]:
    """The engine docker/build.sh picks here and can run images with, or why there is none."""
    done = run(["bash", str(BUILD_SCRIPT), "engine"], timeout=60)
    if done.returncode != 0:
        return None, f"no container engine: {done.stderr.strip()}"
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    env = dict(os.environ)
    if found.get("CONTAINERS_CONF"):
        env["CONTAINERS_CONF"] = found["CONTAINERS_CONF"]
    if found["ENGINE"] == "buildah":
        return None, "only buildah here: it builds images but cannot run them (install podman)"
    return Engine(found["ENGINE"], env), ""


@dataclass(frozen=True)
class Build:
    image: str
    seconds: float
    size_bytes: int


class BackgroundBuild:
    """``docker/build.sh FLAVOUR TAG`` in a process of its own, started as soon as the session
    knows it needs the image, so the build runs beside the tests that do not. Given the session's
    export of the default models (``exported``), it waits for that export and starts the image's
    export stage from its artefacts (seeded_build.py), instead of exporting them a second time
    beside the first: minutes of a 2-core machine's time."""

    def __init__(
        self, engine: Engine, flavour: str, tag: str, run: Path, exported: DefaultArtefacts | None = None
    ) -> None:
        self.engine, self.flavour, self.tag = engine, flavour, tag
        command = ["bash", str(BUILD_SCRIPT), flavour, tag]
        if exported is not None and flavour == "cpu":  # the GPU image exports fp16, not in the seed
            from tests.e2e.real_models import MODELS, VARIANTS  # = the image's (docker/Dockerfile)

            status = exported.status_file()
            artefacts = [f"{model}/{variant}" for model in MODELS for variant in VARIANTS]
            seed = [str(exported.root), str(run / "image-seed"), *artefacts]
            command = [sys.executable, str(SEEDED_BUILD), str(status or "-"), *seed, "--", *command]
        self.process = BackgroundProcess(run, f"image-{flavour}", command, REPO, engine.env)

    def result(self) -> Build:
        """The built image, once the build is over; a failed one fails the test naming why."""
        try:
            code, output = self.process.wait(BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"docker/build.sh {self.flavour} took more than {BUILD_TIMEOUT_S} s")
        assert code == 0, f"docker/build.sh {self.flavour} failed:\n{output}"
        size = int(self.engine.ok("image", "inspect", "--format", "{{.Size}}", self.tag).strip())
        return Build(self.tag, time.time() - self.process.started, size)


def wait_for_status(
    url: str, status: int, timeout_s: float, alive: Callable[[], bool] | None = None
) -> float:
    """Seconds until GET ``url`` answers ``status``; fails after ``timeout_s``."""
    start = time.monotonic()
    last = "no answer"
    while time.monotonic() - start < timeout_s:
        if alive is not None and not alive():
            pytest.fail(f"the container exited while waiting for {status} from {url} (last: {last})")
        try:
            answer = httpx.get(url, timeout=5)
            if answer.status_code == status:
                return time.monotonic() - start
            last = f"{answer.status_code} {answer.text[:200]}"
        except httpx.HTTPError as error:
            last = repr(error)
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer {status} within {timeout_s} s (last: {last})")


def translate_and_embed(base_url: str) -> tuple[list[str], list[list[float]]]:
    """What the smoke tests compare: en→de, de→en and an embedding, through the public API."""
    with httpx.Client(base_url=base_url, timeout=60) as client:
        translations = []
        for source, target, text in (
            ("en", "de", "A man is riding a bicycle down the street."),
            ("de", "en", "Zwei Hunde spielen im Schnee."),
        ):
            answer = client.post(
                "/v1/translate",
                json={"text": [text], "source_language": source, "target_language": target},
            )
            assert answer.status_code == 200, answer.text
            translations.append(answer.json()["translations"][0]["hypotheses"][0]["text"])
        answer = client.post("/v1/embed", json={"texts": ["Two dogs play in the snow."]})
        assert answer.status_code == 200, answer.text
        return translations, answer.json()["embeddings"]
