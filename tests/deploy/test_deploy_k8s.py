"""k8s/: kustomize builds every overlay; the output validates against the Kubernetes schemas
(kubernetes-validate, strict); the Prometheus Operator kinds validate against their structure
(written down below from the CRDs) and their rules through promtool; and the manifests agree
with the service's settings and with each other."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from deploy_helpers import (
    ALERTS,
    K8S,
    KUSTOMIZATIONS,
    OVERLAYS,
    REPO,
    by_kind,
    kustomize_build,
    require_tool,
    run,
    yaml,
)

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate missing: pip install kubernetes-validate"
)

# Oldest Kubernetes minor still widely run, and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}

# --- The Prometheus Operator CRDs, as far as these manifests use them -------------------------
# Field names, types and the duration pattern follow the CRDs' openAPIV3Schema
# (monitoring.coreos.com_servicemonitors / _prometheusrules, operator v0.6x-0.8x). Unknown fields
# are rejected, so a typo (e.g. `scrape_timeout`) fails here instead of being pruned silently by
# the API server.
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string"},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}
PROMETHEUS_RULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "limit": {"type": "integer"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": _STRING_MAP,
                                        "annotations": _STRING_MAP,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}
CRD_SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR_SCHEMA, "PrometheusRule": PROMETHEUS_RULE_SCHEMA}


def _settings_fields() -> set[str]:
    settings = pytest.importorskip("service.settings")
    return {f"TSERVE_{name.upper()}" for name in settings.Settings.model_fields}


def _configmap(docs: list[dict[str, Any]]) -> dict[str, str]:
    return by_kind(docs, "ConfigMap")["data"]


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


# --- build + schema ---------------------------------------------------------------------------


def test_every_kustomization_builds(built: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in built.items():
        kinds = sorted(d["kind"] for d in docs)
        assert kinds == sorted(
            [
                "ConfigMap",
                "Deployment",
                "HorizontalPodAutoscaler",
                "PodDisruptionBudget",
                "PrometheusRule",
                "Service",
                "ServiceMonitor",
            ]
        ), name


def test_overlays_listed_are_all_overlays() -> None:
    on_disk = {p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file()}
    assert on_disk == set(OVERLAYS)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_kinds_validate_strictly(built: dict[str, list[dict[str, Any]]], version: str) -> None:
    for name, docs in built.items():
        for doc in docs:
            if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']} invalid for k8s {version}: {e}")


def test_crd_kinds_validate_against_their_structure(built: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in built.items():
        for doc in docs:
            if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                try:
                    jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
                except jsonschema.ValidationError as e:
                    pytest.fail(f"{name}: {doc['kind']} invalid at {list(e.absolute_path)}: {e.message}")


def test_prometheusrule_rules_pass_promtool(built: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    for name, docs in built.items():
        rules_file = tmp_path / f"{name}-rules.yml"
        rules_file.write_text(yaml.safe_dump({"groups": by_kind(docs, "PrometheusRule")["spec"]["groups"]}))
        result = run([promtool, "check", "rules", str(rules_file)])
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"


# --- one source of truth for the alert rules ----------------------------------------------------


def test_prometheusrule_is_generated_from_the_compose_alerts() -> None:
    import sys

    result = run([sys.executable, str(K8S / "sync_prometheusrule.py"), "--check"])
    assert result.returncode == 0, result.stderr
    rule = yaml.safe_load((K8S / "base" / "prometheusrule.yaml").read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]


# --- the manifests agree with the service and with each other ----------------------------------


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_configmap_keys_are_service_settings(built: dict[str, list[dict[str, Any]]], name: str) -> None:
    known = _settings_fields() | {"OMP_NUM_THREADS"}
    unknown = set(_configmap(built[name])) - known
    assert not unknown, f"{name}: not settings of service/settings.py: {sorted(unknown)}"
    settings = pytest.importorskip("service.settings")
    env = {
        k[len("TSERVE_") :].lower(): v for k, v in _configmap(built[name]).items() if k.startswith("TSERVE_")
    }
    settings.Settings(**env)  # every value parses


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_deployment_probes_security_and_ports(built: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = built[name]
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    c = _container(docs)
    config = _configmap(docs)
    assert c["envFrom"][0]["configMapRef"]["name"] == by_kind(docs, "ConfigMap")["metadata"]["name"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == int(config["TSERVE_PORT"])
    assert config["TSERVE_AUTO_EXPORT"] == "false"  # the image has no torch: it cannot export
    assert c["startupProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 600
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] in ("http", ports["http"])
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind])


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_termination_grace_covers_the_shutdown(built: dict[str, list[dict[str, Any]]], name: str) -> None:
    """preStop sleep + drain delay + shutdown grace (+ margin) must fit in the grace period, and
    the shutdown grace must let a request that was accepted run to its deadline."""
    docs = built[name]
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    config = _configmap(docs)
    command = _container(docs)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] in ("sleep", "/bin/sleep")
    pre_stop = float(command[1])
    drain = float(config["TSERVE_DRAIN_DELAY_S"])
    grace = float(config["TSERVE_SHUTDOWN_GRACE_S"])
    assert grace >= float(config["TSERVE_REQUEST_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + grace + 5


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_service_monitor_hpa_and_pdb_point_at_the_deployment(
    built: dict[str, list[dict[str, Any]]], name: str
) -> None:
    docs = built[name]
    deployment = by_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = by_kind(docs, "Service")
    assert service["metadata"]["name"] == "tserve"  # = the `job` label the alerts and dashboard use
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    monitor = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports
        assert endpoint["path"] == "/metrics"
    hpa = by_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    pods_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert pods_metrics == ["tserve_queue_depth"]
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    pdb = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_cpu_overlay(built: dict[str, list[dict[str, Any]]]) -> None:
    docs = built["cpu"]
    config = _configmap(docs)
    assert config["TSERVE_PROVIDER"] == "cpu"
    assert config["TSERVE_CPU_VARIANT"] in ("int8", "fp32")
    c = _container(docs)
    assert c["image"].endswith("-cpu")
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    # onnxruntime threads per session x models <= the CPU limit
    assert int(config["TSERVE_INTRA_OP_THREADS"]) * 2 <= float(c["resources"]["limits"]["cpu"])
    metrics = {m["type"] for m in by_kind(docs, "HorizontalPodAutoscaler")["spec"]["metrics"]}
    assert metrics == {"Resource", "Pods"}


def test_gpu_overlay(built: dict[str, list[dict[str, Any]]]) -> None:
    docs = built["gpu"]
    config = _configmap(docs)
    assert config["TSERVE_PROVIDER"] == "cuda"
    assert config["TSERVE_VARIANT"] == "fp16"
    c = _container(docs)
    assert c["image"].endswith("-gpu")
    assert str(c["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert pod["nodeSelector"]
    # the merge kept the base's settings
    assert config["TSERVE_SHUTDOWN_GRACE_S"] == _configmap(built["base"])["TSERVE_SHUTDOWN_GRACE_S"]
    metrics = [m["type"] for m in by_kind(docs, "HorizontalPodAutoscaler")["spec"]["metrics"]]
    assert metrics == ["Pods"]


def test_shared_glossaries_component(
    built: dict[str, list[dict[str, Any]]], kubectl: str, tmp_path: Path
) -> None:
    """k8s/components/shared-glossaries on the cpu overlay: the glossary directory on a
    ReadWriteMany claim, everything else as the overlay has it."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(KUSTOMIZATIONS["cpu"], tmp_path)],
                "components": [os.path.relpath(K8S / "components" / "shared-glossaries", tmp_path)],
            }
        ),
        encoding="utf-8",
    )
    docs = kustomize_build(kubectl, tmp_path)
    claim = by_kind(docs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    config = _configmap(docs)
    mount = next(
        m for m in _container(docs)["volumeMounts"] if m["mountPath"] == config["TSERVE_GLOSSARY_DIR"]
    )
    volumes = {v["name"]: v for v in by_kind(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert "emptyDir" in volumes["tmp"]
    overlay = _configmap(built["cpu"])
    assert overlay["TSERVE_GLOSSARY_DIR"].startswith("/tmp/")  # without it: the pod's own emptyDir
    assert {k: v for k, v in config.items() if k != "TSERVE_GLOSSARY_DIR"} == {
        k: v for k, v in overlay.items() if k != "TSERVE_GLOSSARY_DIR"
    }
    assert sorted(d["kind"] for d in docs) == sorted(
        [*(d["kind"] for d in built["cpu"]), "PersistentVolumeClaim"]
    )
    for version in K8S_VERSIONS:
        for doc in (d for d in docs if (d["apiVersion"], d["kind"]) not in CRD_KINDS):
            kubernetes_validate.validate(doc, version, strict=True)


def test_prometheus_adapter_rule_exposes_the_hpa_metric() -> None:
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text(encoding="utf-8"))
    custom = values["rules"]["custom"]
    assert any(
        re.search(r"\btserve_queue_depth\b", r["seriesQuery"]) and r["name"]["as"] == "tserve_queue_depth"
        for r in custom
    )


def test_no_file_outside_the_kustomizations_is_referenced() -> None:
    for path in KUSTOMIZATIONS.values():
        kustomization = yaml.safe_load((path / "kustomization.yaml").read_text(encoding="utf-8"))
        for resource in kustomization.get("resources", []):
            assert (path / resource).exists(), resource
            assert REPO / "k8s" in (path / resource).resolve().parents
