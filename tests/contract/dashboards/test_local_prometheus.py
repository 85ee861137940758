"""cluster/prometheus/prometheus.yml and cluster/local_prometheus.sh."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.dashboards import PROM_CONFIG, REPO, assert_ok, run_promtool

SCRIPT = REPO / "cluster" / "local_prometheus.sh"


@pytest.mark.prometheus
def test_promtool_check_config(promtool):
    # Also checks the referenced rule file; a missing SD file is only a warning.
    assert_ok(run_promtool(promtool, "check", "config", str(PROM_CONFIG)))


def test_script_is_valid_bash_and_executable():
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    help_text = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert "stop" in help_text and "--port" in help_text


def test_script_stop_without_running_instance_is_harmless(tmp_path):
    out = subprocess.run([str(SCRIPT), "stop", "--dir", str(tmp_path)], capture_output=True, text=True, check=True)
    assert "not running" in out.stdout


@pytest.mark.prometheus
def test_script_starts_prometheus_with_the_rules_and_stops_it(tmp_path):
    import json
    import shutil
    import socket
    import urllib.request

    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found on PATH (apt-get install -y prometheus)", pytrace=False)
    with socket.socket() as s:  # a free loopback port, so a real instance on 9090 is untouched
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--port", str(port), "--dir", str(tmp_path)]
    try:
        out = subprocess.run([str(SCRIPT), "start", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert (tmp_path / "prometheus.pid").exists() and (tmp_path / "data").is_dir()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10) as resp:
            groups = json.load(resp)["data"]["groups"]
        loaded = {r["name"] for g in groups for r in g["rules"]}
        assert "RaygenTruncationHigh" in loaded and "raygen:output_tokens_per_second:rate10m" in loaded
    finally:
        stop = subprocess.run([str(SCRIPT), "stop", *args], capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr
    assert not (tmp_path / "prometheus.pid").exists()
