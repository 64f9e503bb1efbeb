"""docker/prometheus/: promtool accepts the scrape config and the alert rules, and the rules'
unit tests (tests/deploy/alerts_test.yml: each alert fires on its condition, and only then) pass."""

from __future__ import annotations

from pathlib import Path

from deploy_helpers import ALERTS, PROMETHEUS_CONFIG, alert_rules, require_tool, run

HERE = Path(__file__).resolve().parent


def test_promtool_check_config() -> None:
    promtool = require_tool("promtool")
    result = run([promtool, "check", "config", str(PROMETHEUS_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_rules() -> None:
    promtool = require_tool("promtool")
    result = run([promtool, "check", "rules", str(ALERTS)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests() -> None:
    promtool = require_tool("promtool")
    result = run([promtool, "test", "rules", str(HERE / "alerts_test.yml")], cwd=HERE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_required_alerts_exist() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert {
        "TServeHighLatencyP99",
        "TServeHigh5xxRate",
        "TServeSustained429",
        "TServeNotReady",
        "TServeDown",
        "TServeAbsent",
    } <= set(rules)
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert "tserve_request_duration_seconds_bucket" in rules["TServeHighLatencyP99"]["expr"]
    assert 'status=~"5.."' in rules["TServeHigh5xxRate"]["expr"]
    assert 'status="429"' in rules["TServeSustained429"]["expr"]
    assert "tserve_ready" in rules["TServeNotReady"]["expr"]
    assert "up{" in rules["TServeDown"]["expr"] and "absent(" in rules["TServeAbsent"]["expr"]
