"""Grafana dashboard JSON: generated, consistent, and every query valid."""

from __future__ import annotations

import json

import pytest

from dashboards import alerts, build, grafana, panels, thresholds
from dashboards import metrics_catalog as mc

from tests.support.dashboards import DASHBOARD_JSON, metric_names, record_names, sglang_names

DS_UID = "${datasource}"


@pytest.fixture(scope="module")
def dash() -> dict:
    return json.loads(DASHBOARD_JSON.read_text())


def _panels(dash):
    return [p for p in dash["panels"] if p["type"] != "row"]


def _exprs(dash):
    return [t["expr"] for p in _panels(dash) for t in p["targets"]]


def test_committed_json_matches_generator(dash):
    assert build.DASHBOARD_JSON not in build.stale_files(), "run `python -m dashboards.build` and commit the result"
    assert dash == panels.build()[0]


def test_panel_ids_are_unique(dash):
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), ids


def test_layout_fits_the_grid_without_overlaps(dash):
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= grafana.GRID_WIDTH, p["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & area, f"panel {p['title']!r} overlaps another panel"
        cells |= area


def test_every_panel_and_target_uses_the_datasource_variable(dash):
    ds_vars = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
    assert ds_vars and ds_vars[0]["type"] == "datasource" and ds_vars[0]["query"] == "prometheus"
    for p in _panels(dash):
        assert p["datasource"]["uid"] == DS_UID, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DS_UID, (p["title"], t["refId"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"]["uid"] == DS_UID, v["name"]


def test_run_and_model_variables_exist(dash):
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "run", "model"} <= names


def test_queries_use_only_catalog_metrics_and_no_recording_rules(dash):
    var_queries = [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    unknown = metric_names(_exprs(dash) + var_queries) - mc.SERIES_NAMES
    assert not unknown, f"metrics not in metrics_catalog: {unknown}"
    unknown = sglang_names(_exprs(dash)) - mc.SGLANG_SERIES
    assert not unknown, f"SGLang series not listed in metrics_catalog.SGLANG_SERIES: {unknown}"
    # The dashboard must work on any Prometheus scraping Ray, rules loaded or not.
    assert not record_names(_exprs(dash))


def test_required_panels_exist(dash):
    used = metric_names(_exprs(dash))
    for m in mc.CATALOG:
        assert set(m.series_names) & used, f"no panel shows {m.prom_name}"
    # SGLang's own signals the issue asks for: TTFT, inter-token latency, cache hit rate, retractions.
    assert sglang_names(_exprs(dash)) == mc.SGLANG_SERIES


def test_truncation_panel_draws_the_runs_own_threshold(dash):
    _, keys = panels.build()
    p = next(p for p in dash["panels"] if p["id"] == keys["truncated_fraction"])
    exprs = [t["expr"] for t in p["targets"]]
    assert f"[{thresholds.TRUNCATION_WINDOW}]" in exprs[0] and 'finish_reason="length"' in exprs[0]
    # The whole-run fraction the alert reads, and the run's threshold gauge as a line.
    assert mc.JOB_ROWS_TRUNCATED.prom_name in exprs[1]
    assert any(mc.JOB_TRUNCATION_THRESHOLD.prom_name in e for e in exprs[2:])


def test_every_alert_links_to_a_panel():
    _, keys = panels.build()
    for a in alerts.ALERTS:
        assert a.panel_key in keys, f"{a.name}: no panel with key {a.panel_key!r}"
