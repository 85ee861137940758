"""Prometheus rules: syntax, unit tests, fire/quiet coverage, metadata, up to date."""

from __future__ import annotations

import re

import pytest

from dashboards import alerts, build, thresholds
from dashboards import metrics_catalog as mc

from tests.support.dashboards import DASH, RULES_TEST, all_rules, load_yaml, metric_names, record_names

def test_generated_rules_are_up_to_date():
    assert build.RULES_YML not in build.stale_files(), "run `python -m dashboards.build` and commit the result"


def _alert_cases():
    """{alertname: {"firing": [...group names], "quiet": [...]}} from the promtool test file."""
    cases: dict = {}
    for group in load_yaml(RULES_TEST)["tests"]:
        for case in group.get("alert_rule_test", []):
            kind = "firing" if case.get("exp_alerts") else "quiet"
            cases.setdefault(case["alertname"], {"firing": [], "quiet": []})[kind].append(group)
    return cases


def test_every_alert_has_a_firing_and_a_quiet_case():
    rule_alerts = {r["alert"] for r in all_rules() if "alert" in r}
    cases = _alert_cases()
    assert set(cases) <= rule_alerts, f"tests for unknown alerts: {set(cases) - rule_alerts}"
    missing = {a: [k for k in ("firing", "quiet") if not cases.get(a, {}).get(k)] for a in rule_alerts}
    missing = {a: k for a, k in missing.items() if k}
    assert not missing, f"alerts without firing/quiet promtool cases: {missing}"


def test_quiet_cases_are_not_vacuous():
    """A 'quiet' case only proves something if it feeds the alert the metrics it reads."""
    for name, kinds in _alert_cases().items():
        wanted = metric_names([alerts.inline_recording_rules(alerts.ALERTS_BY_NAME[name].query)])
        for group in kinds["quiet"]:
            fed = metric_names(s["series"] for s in group.get("input_series", []))
            assert fed & wanted, f"{name}: quiet case in {group.get('name')!r} has no input for {sorted(wanted)}"


def runbook_anchors() -> set:
    """GitHub's anchors for the runbook doc's single-word headings (lowercased)."""
    text = (DASH.parent / alerts.RUNBOOK_DOC).read_text()
    return {h.strip().lower() for h in re.findall(r"^#{2,4} (\S+)\s*$", text, flags=re.M)}


def test_every_alert_has_severity_and_an_absolute_runbook_url_to_an_existing_section():
    anchors = runbook_anchors()
    assert alerts.RUNBOOK_BASE_URL.startswith("https://") and alerts.RUNBOOK_BASE_URL.endswith(alerts.RUNBOOK_DOC)
    for rule in all_rules():
        if "alert" not in rule:
            continue
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        ann = rule["annotations"]
        for key in ("summary", "description", "runbook_url"):
            assert ann.get(key, "").strip(), f"{rule['alert']}: missing annotation {key}"
        base, _, anchor = ann["runbook_url"].partition("#")
        assert base == alerts.RUNBOOK_BASE_URL, ann["runbook_url"]
        assert anchor == rule["alert"].lower() and anchor in anchors, (
            f"{rule['alert']}: runbook_url {ann['runbook_url']!r} has no matching section in {alerts.RUNBOOK_DOC}")


def test_rules_reference_only_catalog_metrics_and_defined_records():
    exprs = [r["expr"] for r in all_rules()]
    unknown = metric_names(exprs) - mc.SERIES_NAMES
    assert not unknown, f"metrics not in metrics_catalog: {unknown}"
    defined = {r["record"] for r in all_rules() if "record" in r}
    assert record_names(exprs) <= defined


def test_truncation_alert_compares_against_the_runs_threshold_gauge_as_a_warning():
    rule = next(r for r in all_rules() if r.get("alert") == "RaygenTruncationHigh")
    assert mc.JOB_TRUNCATION_THRESHOLD.prom_name in rule["expr"] and rule["expr"].endswith("> 1")
    assert rule["labels"]["severity"] == "warning"
    assert rule["for"] == thresholds.TRUNCATION_FOR
    assert rule["keep_firing_for"] == thresholds.TRUNCATION_KEEP_FIRING_FOR


def test_throughput_drop_and_replicas_below_expected_are_warnings():
    rules = {r["alert"]: r for r in all_rules() if "alert" in r}
    assert rules["RaygenThroughputDrop"]["labels"]["severity"] == "warning"
    replicas = rules["RaygenReplicasBelowExpected"]
    assert replicas["labels"]["severity"] == "warning"
    assert mc.JOB_EXPECTED_REPLICAS.prom_name in replicas["expr"] and mc.ENGINE_UP.prom_name in replicas["expr"]


def test_per_replica_alerts_compare_each_replica_with_the_rest_of_its_fleet():
    """Both group by the replica the metric names (the job's engine_replica, Serve's replica)
    within a fleet of one model and run, subtract the replica from its fleet's sum (the
    rest, group_right), and take their thresholds and volume gates from thresholds.py."""
    t = thresholds
    rules = {r.get("alert") or r.get("record"): r for r in all_rules()}
    records = {name: rules[name]["expr"] for name in (
        alerts.CHECKED_PER_REPLICA, alerts.FLAGS_PER_REPLICA,
        alerts.SPEC_TOKENS_PER_REPLICA, alerts.SPEC_STEPS_PER_REPLICA)}
    for name in (alerts.CHECKED_PER_REPLICA, alerts.FLAGS_PER_REPLICA):
        assert "by (model, run, engine_replica)" in records[name]
        assert f"[{t.REPLICA_FLAGGED_WINDOW}]" in records[name]
    assert mc.ROWS_FLAGGED.prom_name in records[alerts.FLAGS_PER_REPLICA]
    for name in (alerts.SPEC_TOKENS_PER_REPLICA, alerts.SPEC_STEPS_PER_REPLICA):
        assert "by (model, run, replica)" in records[name]
        assert f"[{t.REPLICA_ACCEPT_LENGTH_WINDOW}]" in records[name]

    flagged = rules["RaygenReplicaOutputsFlagged"]
    flags = alerts.FLAGS_PER_REPLICA
    rest = f"sum by (model, run) ({flags}) - on (model, run) group_right() {flags}"
    assert rest in flagged["expr"]
    assert (f"clamp_min({t.REPLICA_FLAGGED_FLEET_MULTIPLE:g} * " in flagged["expr"]
            and f", {t.REPLICA_FLAGGED_RATIO_MIN:g})" in flagged["expr"])
    seconds = {"15m": 900, "30m": 1800}
    assert f">= ({t.REPLICA_FLAGGED_MIN_ROWS} / {seconds[t.REPLICA_FLAGGED_WINDOW]})" in flagged["expr"]
    assert flagged["labels"]["severity"] == "critical" and flagged["for"] == t.REPLICA_FLAGGED_FOR

    accept = rules["RaygenReplicaAcceptLengthLow"]
    gate = f">= ({t.REPLICA_ACCEPT_LENGTH_MIN_STEPS} / {seconds[t.REPLICA_ACCEPT_LENGTH_WINDOW]})"
    assert accept["expr"].count(gate) == 2, "both the replica and the rest of its fleet need the volume"
    assert f"group_right() {alerts.SPEC_STEPS_PER_REPLICA}" in accept["expr"]
    assert accept["expr"].endswith(f"< {t.REPLICA_ACCEPT_LENGTH_RATIO:g}")
    assert accept["labels"]["severity"] == "warning" and accept["for"] == t.REPLICA_ACCEPT_LENGTH_FOR


def test_durations_convert_to_seconds_for_the_volume_gates():
    from dashboards import promql as q

    assert [q.seconds(w) for w in ("45s", "15m", "6h", "1d")] == [45, 900, 21600, 86400]
    assert q.per_window(50, "15m") == "(50 / 900)"
    for bad in ("1h30m", "15", "m", "1.5h"):
        with pytest.raises(ValueError, match="single-unit duration"):
            q.seconds(bad)
