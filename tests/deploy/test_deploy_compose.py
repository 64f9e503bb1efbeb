"""docker/compose.yaml run for real with podman-compose: the service and Prometheus, which
scrapes it by its service name with the repository's prometheus.yml and alert rules.

Run as the file says except for what a machine without a registry forces: the CPU image the
container test built (no second build), Prometheus from an image built here from Debian's
`prometheus` package on the same base when `prom/prometheus` cannot be pulled, free host ports,
and no Grafana (its dashboard's queries are checked against a live Prometheus in
test_prometheus_live.py). Two settings are shortened so that the tests wait seconds, not a
scrape interval: the service has no drain delay (nothing routes to it but the tests), and
Prometheus scrapes every 2 s (the repository's prometheus.yml otherwise, jobs and rules as
written).
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from containers import Build, Engine, wait_for_status
from deploy_helpers import DOCKER, PROMETHEUS_CONFIG, run, yaml

from tests.servers import free_port

pytestmark = pytest.mark.slow

# Prometheus from Debian's package, where the compose file's image cannot be pulled. /prometheus
# belongs to its user, as in the official image, so the named volume is writable.
PROMETHEUS_CONTAINERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN mkdir /prometheus && chown nobody:nogroup /prometheus \\
 && apt-get update && apt-get install -y --no-install-recommends prometheus \\
 && rm -rf /var/lib/apt/lists/*
USER nobody
ENTRYPOINT ["/usr/bin/prometheus"]
"""
LOCAL_BASE = "localhost/tserve-python:3.11-bookworm"  # docker/build.sh's base without a registry
SCRAPE_INTERVAL = "2s"


def prometheus_image(engine: Engine, wanted: str, folder: Path) -> str:
    if (
        engine("image", "exists", wanted).returncode == 0
        or engine("pull", "-q", wanted, timeout=60).returncode == 0
    ):
        return wanted
    if engine("image", "exists", LOCAL_BASE).returncode != 0:
        pytest.skip(f"neither {wanted} nor the local base {LOCAL_BASE} to build Prometheus on")
    (folder / "Containerfile").write_text(PROMETHEUS_CONTAINERFILE)
    image = "localhost/tserve-prometheus:debian"
    engine.ok(
        "build", "--network", "host", "--build-arg", f"BASE_IMAGE={LOCAL_BASE}", "-t", image, str(folder),
        timeout=600,
    )  # fmt: skip
    return image


def prometheus_config(folder: Path) -> Path:
    """docker/prometheus/prometheus.yml scraping and evaluating every ``SCRAPE_INTERVAL``."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    config["global"].update(scrape_interval=SCRAPE_INTERVAL, evaluation_interval=SCRAPE_INTERVAL)
    config["global"]["scrape_timeout"] = SCRAPE_INTERVAL
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def compose_for_this_machine(
    image: str, prometheus: str, tserve_port: int, prometheus_port: int, config: Path
) -> dict[str, Any]:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    del services["grafana"]
    compose["volumes"].pop("grafana-data")
    services["tserve"].pop("build")
    services["tserve"]["image"] = image
    services["tserve"]["ports"] = [f"{tserve_port}:8000"]
    services["tserve"]["environment"]["TSERVE_DRAIN_DELAY_S"] = "0"
    services["prometheus"]["image"] = prometheus
    services["prometheus"]["ports"] = [f"{prometheus_port}:9090"]
    services["prometheus"]["volumes"] = [
        _on_this_machine(v, config) for v in services["prometheus"]["volumes"]
    ]
    return compose


def _on_this_machine(volume: str, config: Path) -> str:
    """A volume of the compose file with its ``./`` path from docker/, prometheus.yml's ``config``."""
    source, _, target = volume.partition(":")
    if source.startswith("./"):
        source = str(DOCKER / source[2:])
    if source == str(PROMETHEUS_CONFIG):
        source = str(config)
    return f"{source}:{target}"


@dataclass
class Stack:
    urls: dict[str, str]  # service name → its address on this machine
    command: list[str]  # podman-compose with the project and its file
    env: dict[str, str]

    def run(self, *args: str) -> None:
        done = run([*self.command, *args], timeout=300, env=self.env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def stack(engine: Engine, cpu_image: Build, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    compose_cli = shutil.which("podman-compose")
    if engine.name != "podman" or compose_cli is None:
        pytest.skip("needs podman-compose (Debian package, bash .ci/install-tools.sh)")
    folder = tmp_path_factory.mktemp("compose")
    original = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    prometheus = prometheus_image(engine, original["services"]["prometheus"]["image"], folder)
    ports = {"tserve": free_port(), "prometheus": free_port()}
    compose = compose_for_this_machine(
        cpu_image.image, prometheus, ports["tserve"], ports["prometheus"], prometheus_config(folder)
    )
    (folder / "compose.yaml").write_text(yaml.safe_dump(compose))
    project = f"tservecompose{uuid.uuid4().hex[:6]}"
    command = [compose_cli, "-p", project, "-f", str(folder / "compose.yaml")]
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    stack = Stack(urls, command, engine.env)
    try:
        stack.run("up", "-d")
        yield stack
    finally:
        run([*command, "down"], timeout=180, env=engine.env)
        for volume in compose["volumes"]:
            engine("volume", "rm", "--force", f"{project}_{volume}")


def test_prometheus_scrapes_the_service_by_its_compose_name(stack: Stack) -> None:
    urls = stack.urls
    wait_for_status(f"{urls['tserve']}/health/ready", 200, 180)
    httpx.post(
        f"{urls['tserve']}/v1/translate", json={"text": "A dog runs on the beach."}, timeout=60
    ).raise_for_status()
    query = f"{urls['prometheus']}/api/v1/query"
    deadline = time.monotonic() + 90
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(query, params={"query": 'tserve_requests_total{job="tserve"}'}, timeout=10)
            found = answer.json()["data"]["result"] if answer.status_code == 200 else []
        except httpx.HTTPError:
            found = []
        if found:
            break
        time.sleep(2)
    assert found, "Prometheus has no tserve_requests_total from the job tserve"
    assert {series["metric"]["instance"] for series in found} == {"tserve:8000"}
    up = httpx.get(query, params={"query": 'up{job="tserve"}'}, timeout=10).json()["data"]["result"]
    assert [series["value"][1] for series in up] == ["1"]
    rules = httpx.get(f"{urls['prometheus']}/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert rules, "the alert rules of docker/prometheus/alerts.yml were not loaded"


def test_glossaries_outlive_the_container_on_their_named_volume(stack: Stack) -> None:
    """A glossary created through one container is there in the next one (``down``, ``up``:
    a new container, the named volume kept), under the read-only root and the uid 10001."""
    tserve = stack.urls["tserve"]
    wait_for_status(f"{tserve}/health/ready", 200, 180)
    entries = [{"source": "beach", "target": "Strand"}]
    body = {"name": "shore", "source_language": "en", "target_language": "de", "entries": entries}
    created = httpx.post(f"{tserve}/v1/glossaries", json=body, timeout=30)
    assert created.status_code == 201, created.text
    stack.run("down")
    stack.run("up", "-d")
    wait_for_status(f"{tserve}/health/ready", 200, 180)
    kept = httpx.get(f"{tserve}/v1/glossaries/{created.json()['id']}", timeout=30)
    assert kept.status_code == 200, kept.text
    assert kept.json()["entries"][0]["target"] == "Strand"
    asked = {"text": "A dog runs on the beach.", "glossary": "shore"}
    translated = httpx.post(f"{tserve}/v1/translate", json=asked, timeout=60)
    assert translated.status_code == 200 and "Strand" in translated.text, translated.text
