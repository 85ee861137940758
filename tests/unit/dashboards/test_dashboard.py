"""Grafana dashboard JSON: generated, consistent, and every query valid."""

from __future__ import annotations

import copy
import json

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel

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


def _schema_round_trip(doc: dict) -> dict:
    """The dashboard read into the SDK's Grafana 11.6 types and written back: a key the
    schema does not define (a typo, a field from another Grafana version) is dropped."""
    register_default_plugins()  # panel options and queries are decoded by panel/datasource type
    return json.loads(JSONEncoder().encode(DashboardModel.from_json(doc)))


def test_every_field_is_one_grafanas_schema_defines(dash):
    assert _schema_round_trip(dash) == dash
    # The check bites: a misspelt option (Grafana would ignore it silently) does not survive.
    typo = copy.deepcopy(dash)
    next(p for p in typo["panels"] if p["type"] == "timeseries")["fieldConfig"]["defaults"]["custom"][
        "thresholdStyle"] = {"mode": "line"}
    assert _schema_round_trip(typo) != typo


def test_a_panel_that_does_not_fit_its_line_is_refused():
    # The SDK wraps only after a full line, so 18 + 12 would put the second panel at x=18..30.
    row = grafana.Row("r", [grafana.timeseries("a", grafana.target("up")).span(18),
                            grafana.timeseries("b", grafana.target("up")).span(12)])
    with pytest.raises(ValueError, match="past column 24.*'b'"):
        grafana.dashboard("t", "u", [row], [])
    twice = grafana.Row("r", [grafana.timeseries(n, grafana.target("up")).key("k") for n in "ab"])
    with pytest.raises(ValueError, match="duplicate panel key 'k'"):
        grafana.dashboard("t", "u", [twice], [])


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


def test_integrity_panels_show_each_replica_against_its_fleet(dash):
    _, keys = panels.build()
    by_id = {p["id"]: p for p in dash["panels"]}
    flagged = by_id[keys["replica_flagged"]]
    exprs = [t["expr"] for t in flagged["targets"]]
    window = f"[{thresholds.REPLICA_FLAGGED_WINDOW}]"
    # Per replica (the job's engine_replica label), then the fleet's rate and its multiple.
    assert "by (model, run, engine_replica)" in exprs[0]
    assert all(window in e and mc.ROWS_CHECKED.prom_name in e and mc.ROWS_FLAGGED.prom_name in e for e in exprs)
    assert "engine_replica" not in exprs[1] and exprs[2].startswith(f"{thresholds.REPLICA_FLAGGED_FLEET_MULTIPLE:g} * ")
    steps = flagged["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": thresholds.REPLICA_FLAGGED_RATIO_MIN}
    assert flagged["fieldConfig"]["defaults"]["unit"] == "percentunit"

    kinds = next(p for p in _panels(dash) if p["title"] == "Flags by kind")
    assert "sum by (flag)" in kinds["targets"][0]["expr"] and mc.ROWS_FLAGGED.prom_name in kinds["targets"][0]["expr"]

    accept = by_id[keys["replica_accept_length"]]
    exprs = [t["expr"] for t in accept["targets"]]
    assert "by (model, run, replica)" in exprs[0] and mc.SPEC_VERIFY_STEPS.prom_name in exprs[0]
    assert exprs[1].startswith(f"{thresholds.REPLICA_ACCEPT_LENGTH_RATIO:g} * ") and "replica" not in exprs[1]
