"""docker/grafana/dashboards/tserve.json: valid JSON, data source parameterised through the
${datasource} variable, and every query on metrics that service/metrics.py defines.
(tests/deploy/test_prometheus_live.py runs every query against a real Prometheus.)"""

from __future__ import annotations

import re

import pytest
from deploy_helpers import dashboard_panels, dashboard_queries, defined_metric_names, load_dashboard

_IDENT = re.compile(r"\btserve_[a-zA-Z0-9_]+\b")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return load_dashboard()


def test_datasource_is_a_template_variable(dashboard: dict) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"
    for panel in dashboard_panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_panels_are_laid_out(dashboard: dict) -> None:
    panels = dashboard_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        cells |= mine
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36


def test_every_query_uses_only_defined_metrics(dashboard: dict) -> None:
    defined = defined_metric_names()
    for where, expr in dashboard_queries(dashboard):
        used = set(_IDENT.findall(expr))
        assert used, f"{where}: targets no tserve metric: {expr}"
        assert used <= defined, f"{where}: not in service/metrics.py: {sorted(used - defined)}"


def test_the_dashboard_shows_what_operators_need(dashboard: dict) -> None:
    exprs = " ".join(expr for _, expr in dashboard_queries(dashboard))
    for needed in (
        "tserve_requests_total",
        "tserve_request_duration_seconds_bucket",
        "tserve_queue_depth",
        "tserve_batch_size_bucket",
        "tserve_batch_tokens_bucket",
        "tserve_stage_duration_seconds",
        "tserve_input_tokens_total",
        "tserve_output_tokens_total",
        "tserve_model_info",
        "tserve_ready",
        "tserve_decode_running_sentences",
        "tserve_decode_free_rows",
        "tserve_decode_step_seconds_bucket",
        "tserve_decode_admitted_sentences",
    ):
        assert needed in exprs, needed
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}, sum by (endpoint, le)" in exprs
    assert "sum by (status)" in exprs
    info = next(p for p in dashboard_panels(dashboard) if "tserve_model_info" in str(p.get("targets")))
    assert {"variant", "provider"} <= set(re.findall(r"\w+", info["targets"][0]["expr"]))


# Metrics labelled by model (service/metrics.py): with several models, a panel on them must not
# add their series together.
_PER_MODEL = re.compile(
    r"\btserve_(queue_depth|batch_size|batch_tokens|stage_duration_seconds|input_tokens|output_tokens|decode_)"
)


def test_per_model_metrics_are_shown_per_model(dashboard: dict) -> None:
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            expr = target["expr"]
            if not _PER_MODEL.search(expr):
                continue
            assert 'model=~"$model"' in expr, (panel["title"], expr)
            grouped = all("by (model" in by for by in re.findall(r"\bby \([^)]*\)", expr))
            assert grouped or panel.get("repeat") == "model", (panel["title"], expr)
