"""The metrics catalog stays import-light: a fresh interpreter imports it without Ray."""

from __future__ import annotations

import subprocess
import sys

from tests.support.dashboards import REPO


def test_catalog_import_does_not_pull_in_ray():
    code = "import sys, dashboards.metrics_catalog; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
