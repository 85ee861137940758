"""promtool parses every query of the provisioned Grafana alerts."""

from __future__ import annotations

import pytest
import yaml

from tests.support.dashboards import PROVISIONING, assert_ok, load_yaml, run_promtool

ALERTING = PROVISIONING / "alerting" / "raygen_alerts.yml"


def _grafana_rules():
    return [r for g in load_yaml(ALERTING)["groups"] for r in g["rules"]]


@pytest.mark.prometheus
def test_grafana_alert_queries_are_valid_promql(promtool, tmp_path):
    rules = [{"record": f"raygen_grafana_query_{i}", "expr": r["data"][0]["model"]["expr"]}
             for i, r in enumerate(_grafana_rules())]
    path = tmp_path / "grafana_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}))
    assert_ok(run_promtool(promtool, "check", "rules", str(path)))
