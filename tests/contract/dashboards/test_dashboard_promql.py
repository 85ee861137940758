"""promtool parses every query of the Grafana dashboard."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.dashboards import DASHBOARD_JSON, assert_ok, run_promtool


@pytest.fixture(scope="module")
def dash() -> dict:
    return json.loads(DASHBOARD_JSON.read_text())


def _exprs(dash):
    return [t["expr"] for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]


@pytest.mark.prometheus
def test_every_panel_query_is_valid_promql(dash, promtool, tmp_path):
    """promtool parses each query (Grafana variables replaced by sample values)."""
    subst = {"$__rate_interval": "1m", "$run": "r1", "$model": "m"}
    queries = _exprs(dash)
    rules = []
    for i, q in enumerate(queries):
        for k, v in subst.items():
            q = q.replace(k, v)
        assert "$" not in q, f"unsubstituted variable in {q}"
        rules.append({"record": f"raygen_panel_query_{i}", "expr": q})
    path = tmp_path / "panel_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    assert_ok(run_promtool(promtool, "check", "rules", str(path)))
