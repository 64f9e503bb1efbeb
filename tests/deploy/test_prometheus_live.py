"""A real Prometheus scraping a real service, both on loopback: every PromQL expression of the
Grafana dashboard and of the alert rules must return data.

The service is tests/service/run_small_server.py's server — the real entry point (uvicorn,
middleware, queues, metrics) over the small NumPy engines, no model files — through
tests/deploy/metered_server.py, which adds the engines' own metrics (token counters, stages).
Prometheus (the Debian `prometheus` binary) gets docker/prometheus/prometheus.yml with the
target, the scrape/evaluation intervals (1 s) and the rules path adapted, and loads the real
docker/prometheus/alerts.yml. After some traffic (translations, embeddings, 422s) and a few
scrapes, each dashboard query (Grafana variables substituted) and each alert expression (its
left-hand side: an alert's condition is normally false, so the full expression is empty) goes
through /api/v1/query. Every wait is bounded; both processes are stopped at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from deploy_helpers import (
    ALERTS,
    DOCKER,
    PROMETHEUS_CONFIG,
    REPO,
    alert_rules,
    dashboard_queries,
    load_dashboard,
    require_tool,
    strip_comparison,
    yaml,
)

from tests.servers import free_port

SMALL_ENGINES = REPO / "tests" / "service" / "small_engines.py"
SERVER = Path(__file__).resolve().parent / "metered_server.py"
START_TIMEOUT_S = 60.0
SCRAPE_TIMEOUT_S = 45.0


@dataclass
class Live:
    service: str  # http://127.0.0.1:PORT
    service_port: int
    prometheus: str
    sent: dict[str, int]


def _http(url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _wait_for(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited with {proc.returncode}")
        try:
            if check():
                return
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout:g} s (last error: {last})")


def query(prometheus: str, expr: str) -> dict[str, Any]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    status, body = _http(url)
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", f"{expr}: {status} {answer}"
    return answer["data"]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _traffic(base: str, sent: dict[str, int], rounds: int) -> None:
    requests: list[tuple[str, Any, int]] = [
        ("/v1/translate", {"text": "a small test sentence"}, 200),
        ("/v1/translate", {"text": ["two sentences", "in one request"], "beam_size": 2}, 200),
        ("/v1/embed", {"texts": ["embed this", "and this one too"]}, 200),
        ("/v1/embeddings", {"input": "openai style"}, 200),
        ("/v1/translate", {"text": "x", "beam_size": 0}, 422),
        ("/v1/embed", {"texts": []}, 422),
    ]
    for _ in range(rounds):
        for path, body, expected in requests:
            status, answer = _http(base + path, body)
            assert status == expected, f"POST {path} {body}: {status} {answer[:300]!r}"
            sent[str(status)] = sent.get(str(status), 0) + 1
        status, _ = _http(base + "/v1/models")
        assert status == 200
        # a file, for the file-translation panel
        answer = httpx.post(
            base + "/v1/translate/file", files={"file": ("notes.txt", b"a file to translate")}
        )
        assert answer.status_code == 200, answer.text[:300]
        sent["200"] = sent.get("200", 0) + 1


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    prometheus_bin = require_tool("prometheus")
    if not SMALL_ENGINES.is_file():
        pytest.skip(f"{SMALL_ENGINES.relative_to(REPO)} missing: no small engines to serve")
    tmp = tmp_path_factory.mktemp("prometheus-live")
    service_port, prometheus_port = free_port(), free_port()

    env = {k: v for k, v in os.environ.items() if not k.startswith("TSERVE_")}
    env.update(
        TSERVE_HOST="127.0.0.1",
        TSERVE_PORT=str(service_port),
        TSERVE_LOG_LEVEL="warning",
        TSERVE_MAX_WAIT_MS="2",
        TSERVE_SHUTDOWN_GRACE_S="5",
        TSERVE_DRAIN_DELAY_S="0",  # stopped at the end, with no load balancer to tell first
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    service_log = open(tmp / "service.log", "wb")  # noqa: SIM115 (closed at teardown)
    service = subprocess.Popen(
        [sys.executable, str(SERVER), "--delay-s", "0.005"],
        cwd=REPO,
        env=env,
        stdout=service_log,
        stderr=subprocess.STDOUT,
    )
    prometheus: subprocess.Popen[bytes] | None = None
    prometheus_log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
    try:
        base = f"http://127.0.0.1:{service_port}"
        _wait_for(
            "service ready",
            lambda: _http(base + "/health/ready", timeout=2)[0] == 200,
            START_TIMEOUT_S,
            service,
        )

        config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
        config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        config["rule_files"] = [str(ALERTS)]
        jobs = [job for job in config["scrape_configs"] if job["job_name"] == "tserve"]
        assert len(jobs) == 1, "docker/prometheus/prometheus.yml: no `tserve` scrape job"
        jobs[0]["static_configs"] = [{"targets": [f"127.0.0.1:{service_port}"]}]
        config["scrape_configs"] = jobs
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        prometheus = subprocess.Popen(
            [
                prometheus_bin,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
            ],
            cwd=tmp,
            stdout=prometheus_log,
            stderr=subprocess.STDOUT,
        )
        prom = f"http://127.0.0.1:{prometheus_port}"
        _wait_for(
            "prometheus ready",
            lambda: _http(prom + "/-/ready", timeout=2)[0] == 200,
            START_TIMEOUT_S,
            prometheus,
        )

        sent: dict[str, int] = {}
        _traffic(base, sent, rounds=3)

        def scraped_twice_after_first_burst() -> bool:
            data = query(prom, 'count_over_time(tserve_requests_total{job="tserve", status="422"}[1m])')
            return bool(data["result"]) and min(float(r["value"][1]) for r in data["result"]) >= 2

        _wait_for(
            "two scrapes after the traffic", scraped_twice_after_first_burst, SCRAPE_TIMEOUT_S, prometheus
        )
        _traffic(base, sent, rounds=2)  # a second burst, so the rates are positive too
        wanted = sent["422"]

        def scraped_second_burst() -> bool:
            data = query(prom, 'sum(tserve_requests_total{job="tserve", status="422"})')
            return bool(data["result"]) and float(data["result"][0]["value"][1]) >= wanted

        _wait_for("a scrape after the second burst", scraped_second_burst, SCRAPE_TIMEOUT_S, prometheus)
        time.sleep(2.5)  # and two more scrapes and rule evaluations
        yield Live(service=base, service_port=service_port, prometheus=prom, sent=sent)
    finally:
        if prometheus is not None:
            _stop(prometheus)
        _stop(service)
        service_log.close()
        prometheus_log.close()


def test_target_is_up_and_ready(live: Live) -> None:
    up = query(live.prometheus, 'up{job="tserve"}')["result"]
    assert [r["value"][1] for r in up] == ["1"]
    ready = query(live.prometheus, 'tserve_ready{job="tserve"}')["result"]
    assert [r["value"][1] for r in ready] == ["1"]


def test_every_dashboard_query_returns_data(live: Live) -> None:
    empty = []
    for where, expr in dashboard_queries(load_dashboard()):
        if not query(live.prometheus, expr)["result"]:
            empty.append(f"{where}: {expr}")
    assert not empty, "no data for:\n" + "\n".join(empty)


def test_every_alert_expression_evaluates_and_its_condition_returns_data(live: Live) -> None:
    empty = []
    for rule in alert_rules():
        query(live.prometheus, rule["expr"])  # the full expression is valid PromQL (result may be empty)
        condition = strip_comparison(rule["expr"])
        assert condition != rule["expr"].strip(), f"{rule['alert']}: no comparison or absent() to strip"
        if not query(live.prometheus, condition)["result"]:
            empty.append(f"{rule['alert']}: {condition}")
    assert not empty, "no data for:\n" + "\n".join(empty)


def test_prometheus_loaded_and_evaluates_the_rules(live: Live) -> None:
    _, body = _http(f"{live.prometheus}/api/v1/rules")
    groups = json.loads(body)["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == {r["alert"] for r in alert_rules()}
    for name, rule in rules.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"
    # a healthy service under light traffic: nothing pending or firing
    assert {name: r["state"] for name, r in rules.items() if r["state"] != "inactive"} == {}


def test_docker_healthcheck_command_probes_readiness(live: Live) -> None:
    """The HEALTHCHECK of both Dockerfiles, run as written (python → this interpreter)."""
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        text = (DOCKER / dockerfile).read_text(encoding="utf-8").replace("\\\n", " ")
        line = next(line for line in text.splitlines() if line.startswith("HEALTHCHECK"))
        command = json.loads(line[line.index("CMD") + 3 :].strip())
        assert command[0] == "python"
        command[0] = sys.executable
        env = {**os.environ, "TSERVE_PORT": str(live.service_port)}
        ok = subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)
        assert ok.returncode == 0, ok.stderr.decode()
        env["TSERVE_PORT"] = str(free_port())  # nothing listens there
        down = subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)
        assert down.returncode != 0


def test_traffic_was_counted(live: Live) -> None:
    by_status = {
        r["metric"]["status"]: float(r["value"][1])
        for r in query(live.prometheus, 'sum by (status) (tserve_requests_total{job="tserve"})')["result"]
    }
    assert by_status.get("422", 0) >= live.sent["422"]
    assert by_status.get("200", 0) >= live.sent["200"]
