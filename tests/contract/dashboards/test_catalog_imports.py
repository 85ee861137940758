"""The metrics catalog and the driver's metrics stay import-light (fresh interpreters)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.dashboards import REPO


def test_catalog_import_does_not_pull_in_ray():
    code = "import sys, dashboards.metrics_catalog; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_driver_metrics_do_not_import_the_dashboard_builder():
    # The driver links to the dashboard by its uid; building the dashboard (the Grafana SDK) is a dev step.
    code = ("import sys, jobs.runs.job_metrics; "
            "print(sorted(m for m in sys.modules if m.startswith(('grafana_foundation_sdk', 'dashboards.panels', "
            "'dashboards.grafana'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
