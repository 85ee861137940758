"""Prometheus rules under promtool: syntax, the rule unit tests, and the same unit tests
on the Grafana form of the alerts."""

from __future__ import annotations

import shutil

import pytest
import yaml

from dashboards import alerts

from tests.support.dashboards import RULES, RULES_TEST, assert_ok, record_names, run_promtool

pytestmark = pytest.mark.prometheus


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
