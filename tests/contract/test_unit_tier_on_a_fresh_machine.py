"""The unit tier passes on a machine that has never run matplotlib: its first import
builds a font cache by running `fc-list`, which the unit tier's no-process guard
(tests/unit/conftest.py) would refuse inside a test. MPLCONFIGDIR pointed at an empty
folder is such a machine (matplotlib keeps its cache there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_report_unit_tests_pass_with_no_matplotlib_cache(tmp_path):
    env = dict(os.environ, MPLCONFIGDIR=str(tmp_path / "mpl"))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/unit/jobs/analysis/test_report.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert list((tmp_path / "mpl").glob("fontlist-*.json")), "matplotlib built no font cache"
