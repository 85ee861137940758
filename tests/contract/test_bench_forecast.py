"""`python -m bench.forecast` in a fresh interpreter (it reads the old forecast.py with
`git show`): every figure printed, the old and new forecasts agree, scipy's censored
MLE agrees with the Newton fit; an unknown revision is a clear error. No timing checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.forecast import BEFORE

REPO = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.forecast", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_bench_prints_before_after_and_they_agree():
    if subprocess.run(["git", "cat-file", "-e", f"{BEFORE}^{{commit}}"], cwd=REPO).returncode:
        pytest.skip(f"this checkout lacks the history the benchmark reads ({BEFORE[:12]})")
    done = _bench("--rows", "3000", "--repeats", "1", "--scipy-resamples", "2")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for name in ("forecast_report", "normal tail log_q", "Kaplan-Meier", "censored fit"):
        line = next(l for l in out.splitlines() if l.startswith(name))
        assert len(re.findall(r"\d+\.\d+", line)) == 3, line   # before, after, ratio
    assert "(projected from 2 resamples" in out
    diffs = re.search(r"max \|mu\| diff (\S+), max \|sigma\| diff (\S+)", out)
    assert max(float(diffs[1]), float(diffs[2])) < 1e-3, out
    errors = re.search(r"before (\S+), after (\S+)$", out, re.M)
    assert float(errors[2]) < 1e-12 < 1e-8 < float(errors[1]) < 2e-7, out
    gaps = re.search(r"fractions \(model, KM and ranges\) (\S+), mean tokens (\S+)", out)
    assert float(gaps[1]) < 1e-4 and float(gaps[2]) <= 0.1, out


def test_unknown_revision_is_a_clear_error():
    done = _bench("--before", "no-such-rev", "--rows", "100")
    assert done.returncode != 0
    assert "jobs/analysis/forecast.py at no-such-rev" in done.stderr
