"""The ingress in front (k8s/ingress/) holds the same limits as the service behind it, so that
it refuses what a pod would refuse, and its timeouts never cut an answer the pod is still
allowed to give. Values are checked against service/settings.py and the base ConfigMap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import Settings

K8S = Path(__file__).resolve().parents[2] / "k8s"


def _configmap_settings() -> Settings:
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    (generator,) = (g for g in kustomization["configMapGenerator"] if g["name"] == "tserve-config")
    env = dict(literal.split("=", 1) for literal in generator["literals"])
    fields = {k.removeprefix("TSERVE_").lower(): v for k, v in env.items() if k.startswith("TSERVE_")}
    return Settings.model_validate(fields)


def _size(value: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20}
    return int(value[:-1]) * units[value[-1].lower()] if value[-1].lower() in units else int(value)


@pytest.mark.parametrize("settings", [Settings(), _configmap_settings()], ids=["defaults", "k8s-configmap"])
def test_the_ingress_limits_match_the_service(settings: Settings) -> None:
    ingress: dict[str, Any] = yaml.safe_load((K8S / "ingress" / "ingress.yaml").read_text())
    notes = ingress["metadata"]["annotations"]
    config = yaml.safe_load((K8S / "ingress" / "controller-values.yaml").read_text())["controller"]["config"]
    prefix = "nginx.ingress.kubernetes.io/"

    assert _size(notes[prefix + "proxy-body-size"]) == settings.max_body_bytes
    assert notes[prefix + "proxy-request-buffering"] == "on"
    assert _size(notes[prefix + "client-body-buffer-size"]) >= settings.max_body_bytes
    assert float(notes[prefix + "proxy-read-timeout"]) > settings.request_timeout_s
    assert float(config["client-header-timeout"]) <= settings.header_timeout_s
    assert float(config["client-body-timeout"]) <= settings.body_timeout_s
    _, size = config["large-client-header-buffers"].split()
    assert settings.max_request_line_bytes <= _size(size) <= settings.max_header_bytes
    assert float(config["upstream-keepalive-timeout"]) < settings.keep_alive_timeout_s


def test_the_ingress_routes_to_the_service_port() -> None:
    ingress = yaml.safe_load((K8S / "ingress" / "ingress.yaml").read_text())
    service = yaml.safe_load((K8S / "base" / "service.yaml").read_text())
    (rule,) = ingress["spec"]["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(ingress, "1.29", strict=True)
