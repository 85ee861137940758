"""Grafana provisioning files: parse, reference each other correctly, known metrics only."""

from __future__ import annotations

import json
import re

import yaml

from dashboards import alerts, build, panels, thresholds
from dashboards import metrics_catalog as mc

from tests.support.dashboards import DASHBOARD_JSON, PROVISIONING, load_yaml, metric_names, record_names

ALERTING = PROVISIONING / "alerting" / "raygen_alerts.yml"
DATASOURCES = PROVISIONING / "datasources" / "raygen.yml"
DASHBOARD_PROVIDERS = PROVISIONING / "dashboards" / "raygen.yml"


def _grafana_rules():
    return [r for g in load_yaml(ALERTING)["groups"] for r in g["rules"]]


def test_all_provisioning_files_parse_with_api_version_1():
    files = sorted(PROVISIONING.rglob("*.yml")) + sorted(PROVISIONING.rglob("*.yaml"))
    assert {f.parent.name for f in files} >= {"alerting", "datasources", "dashboards"}
    for f in files:
        doc = yaml.safe_load(f.read_text())
        assert doc["apiVersion"] == 1, f


def test_alerting_file_is_up_to_date():
    assert build.GRAFANA_ALERTS_YML not in build.stale_files(), "run `python -m dashboards.build`"


def test_datasource_uses_env_url_and_the_uid_alerts_reference():
    (ds,) = load_yaml(DATASOURCES)["datasources"]
    assert ds["type"] == "prometheus"
    assert ds["uid"] == alerts.GRAFANA_DATASOURCE_UID
    assert re.fullmatch(r"\$\{?[A-Z_]+\}?", ds["url"]), f"url should come from an env var, got {ds['url']!r}"


def test_dashboard_provider_points_at_a_folder_via_env():
    (prov,) = load_yaml(DASHBOARD_PROVIDERS)["providers"]
    assert prov["type"] == "file"
    assert prov["options"]["path"].startswith("$"), "path must be env-configurable (repo location varies)"
    assert DASHBOARD_JSON.parent.name == "grafana" and DASHBOARD_JSON.exists()


def test_truncation_alert_is_provisioned_against_the_runs_threshold():
    rules = {r["title"]: r for r in _grafana_rules()}
    r = rules["RaygenTruncationHigh"]
    cond = next(d for d in r["data"] if d["refId"] == r["condition"])["model"]
    assert cond["type"] == "threshold"
    assert cond["conditions"][0]["evaluator"] == {"type": "gt", "params": [1]}
    assert r["for"] == thresholds.TRUNCATION_FOR and r["labels"]["severity"] == "warning"
    assert mc.JOB_TRUNCATION_THRESHOLD.prom_name in r["data"][0]["model"]["expr"]


def test_grafana_rules_are_complete_and_consistent():
    dash = json.loads(DASHBOARD_JSON.read_text())
    panel_ids = {p["id"] for p in dash["panels"]}
    rules = _grafana_rules()
    assert {r["title"] for r in rules} == set(alerts.ALERTS_BY_NAME)
    assert len({r["uid"] for r in rules}) == len(rules)
    for r in rules:
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", r["uid"]), r["uid"]
        ref_ids = [d["refId"] for d in r["data"]]
        assert r["condition"] in ref_ids and len(ref_ids) == len(set(ref_ids))
        query = r["data"][0]
        assert query["datasourceUid"] == alerts.GRAFANA_DATASOURCE_UID
        for d in r["data"][1:]:
            assert d["datasourceUid"] == "__expr__" and d["model"]["expression"] in ref_ids
        assert r["dashboardUid"] == panels.UID == dash["uid"] and r["panelId"] in panel_ids
        assert r["labels"]["severity"] in ("critical", "warning")
        # Grafana env-expands label values: a stray "$" would be silently replaced.
        assert not any("$" in v for v in r["labels"].values())
        for key in ("summary", "description", "runbook_url"):
            assert r["annotations"].get(key), (r["title"], key)
        # Grafana's $value is a debug string; templates must use $values.<refId>.
        assert "$value " not in r["annotations"]["description"] and "$value|" not in r["annotations"]["description"]


def test_grafana_alert_queries_reference_known_metrics_only():
    exprs = [r["data"][0]["model"]["expr"] for r in _grafana_rules()]
    unknown = metric_names(exprs) - mc.SERIES_NAMES
    assert not unknown, f"metrics not in metrics_catalog: {unknown}"
    assert not record_names(exprs), "Grafana alerts must not depend on raygen recording rules"
