"""Monitoring wiring in cluster/ under its tools: bash runs the head script, promtool
checks the PrometheusRule the KubeRay monitoring applies."""

from __future__ import annotations

import re
import subprocess

import yaml

from dashboards import build

from tests.support.dashboards import REPO, assert_ok, load_yaml, run_promtool

HEAD_SCRIPT = REPO / "cluster" / "head_monitoring.sh"


def test_head_monitoring_script_is_valid_and_uses_the_repo_config():
    subprocess.run(["bash", "-n", str(HEAD_SCRIPT)], check=True)
    help_text = subprocess.run([str(HEAD_SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert "start" in help_text and "--dir" in help_text
    text = HEAD_SCRIPT.read_text()
    assert "cluster/local_prometheus.sh" in text and "dashboards/grafana/raygen.json" in text
    major, minor, _ = map(int, re.search(r'PROMETHEUS_VERSION="([\d.]+)"', text).group(1).split("."))
    assert (major, minor) >= (2, 42), "raygen_rules.yml uses keep_firing_for (Prometheus >= 2.42)"


def test_kube_prometheus_rule_passes_promtool(promtool, tmp_path):
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(load_yaml(build.KUBE_RULE_YML)["spec"]))
    assert_ok(run_promtool(promtool, "check", "rules", str(tmp_path / "rules.yml")))
