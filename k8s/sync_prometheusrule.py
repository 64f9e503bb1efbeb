"""Generate k8s/base/prometheusrule.yaml from docker/prometheus/alerts.yml.

The alert rules have ONE source, docker/prometheus/alerts.yml (what the compose Prometheus
loads). Kustomize cannot read files outside k8s/, so the PrometheusRule embeds a copy of that
file's ``groups`` verbatim (comments included). Run after editing the rules:

    python k8s/sync_prometheusrule.py           # rewrite k8s/base/prometheusrule.yaml
    python k8s/sync_prometheusrule.py --check   # exit 1 if it is stale (tests/deploy runs this)

Plain text only (no YAML library), so it runs with any Python 3.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "docker" / "prometheus" / "alerts.yml"
TARGET = ROOT / "k8s" / "base" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from docker/prometheus/alerts.yml by `python k8s/sync_prometheusrule.py`: do not edit.
# `release: kube-prometheus-stack` matches the default ruleSelector of the kube-prometheus-stack
# chart installed under that release name; change it to your Prometheus' selector.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: tserve
  labels:
    app.kubernetes.io/name: tserve
    release: kube-prometheus-stack
spec:
"""


def render(source: str) -> str:
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise SystemExit(f"{SOURCE}: no top-level `groups:`")
    body = [("  " + line) if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body).rstrip() + "\n"


def main(argv: list[str]) -> int:
    wanted = render(SOURCE.read_text(encoding="utf-8"))
    if argv == ["--check"]:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != wanted:
            print(
                f"{TARGET.relative_to(ROOT)} is stale: run python k8s/sync_prometheusrule.py", file=sys.stderr
            )
            return 1
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    TARGET.write_text(wanted, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
