"""Prometheus rules: syntax, unit tests, fire/quiet coverage, metadata, up to date."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from dashboards import alerts, build, thresholds
from dashboards import metrics_catalog as mc

from .conftest import (DASH, RULES, RULES_TEST, all_rules, assert_ok, load_yaml, metric_names, record_names,
                       run_promtool)

pytestmark = pytest.mark.prometheus


def test_generated_rules_are_up_to_date():
    assert build.RULES_YML not in build.stale_files(), "run `python -m dashboards.build` and commit the result"


def test_promtool_check_rules(promtool):
    assert_ok(run_promtool(promtool, "check", "rules", str(RULES)))


def test_promtool_test_rules(promtool):
    # Run from the file's directory: rule_files paths are relative to it.
    assert_ok(run_promtool(promtool, "test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent))


def test_grafana_form_of_alerts_passes_the_same_unit_tests(promtool, tmp_path):
    """Grafana alerts inline the recording rules; prove the inlined PromQL behaves
    exactly like the Prometheus alerts by running the same promtool cases on it."""
    doc = alerts.prometheus_rules()
    for rule in doc["groups"][0]["rules"]:
        if "alert" in rule:
            a = alerts.ALERTS_BY_NAME[rule["alert"]]
            rule["expr"] = f"{alerts.inline_recording_rules(a.query)} {a.op} {a.threshold:g}"
            assert not record_names([rule["expr"]]), rule["expr"]
    (tmp_path / RULES.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    assert_ok(run_promtool(promtool, "test", "rules", RULES_TEST.name, cwd=tmp_path))


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


def test_every_alert_has_severity_and_annotations():
    readme = (DASH / "README.md").read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^#{2,4} (\S+)\s*$", readme, flags=re.M)}
    for rule in all_rules():
        if "alert" not in rule:
            continue
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        ann = rule["annotations"]
        for key in ("summary", "description", "runbook"):
            assert ann.get(key, "").strip(), f"{rule['alert']}: missing annotation {key}"
        path, _, anchor = ann["runbook"].partition("#")
        assert path == "dashboards/README.md" and anchor in anchors, (
            f"{rule['alert']}: runbook {ann['runbook']!r} has no matching README section")


def test_rules_reference_only_catalog_metrics_and_defined_records():
    exprs = [r["expr"] for r in all_rules()]
    unknown = metric_names(exprs) - mc.SERIES_NAMES
    assert not unknown, f"metrics not in metrics_catalog: {unknown}"
    defined = {r["record"] for r in all_rules() if "record" in r}
    assert record_names(exprs) <= defined


def test_truncation_threshold_comes_from_the_shared_constant():
    rule = next(r for r in all_rules() if r.get("alert") == "RaygenTruncationHigh")
    assert rule["expr"].endswith(f"> {thresholds.TRUNCATION_FRACTION_MAX:g}")
    assert rule["for"] == thresholds.TRUNCATION_FOR
    assert f"[{thresholds.TRUNCATION_WINDOW}]" in alerts.RECORDING_RULES[alerts.TRUNC]
