"""Paths and metric-name helpers shared by the dashboards tests (unit and promtool)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Iterable, List, Set

import yaml

REPO = Path(__file__).resolve().parents[2]
DASH = REPO / "dashboards"
RULES = DASH / "prometheus" / "raygen_rules.yml"
RULES_TEST = DASH / "prometheus" / "raygen_rules_test.yml"
DASHBOARD_JSON = DASH / "grafana" / "raygen.json"
PROVISIONING = DASH / "grafana" / "provisioning"
PROM_CONFIG = REPO / "cluster" / "prometheus" / "prometheus.yml"

_METRIC_RE = re.compile(r"(?<![\w:])(ray_raygen_\w+)")
_RECORD_RE = re.compile(r"(?<![\w:])(raygen:\w+:\w+)")
_SGLANG_RE = re.compile(r"(?<![\w:])(sglang:\w+)")


def run_promtool(promtool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{proc.stdout}\n{proc.stderr}"


def metric_names(exprs: Iterable[str]) -> Set[str]:
    return {m for e in exprs for m in _METRIC_RE.findall(e)}


def sglang_names(exprs: Iterable[str]) -> Set[str]:
    return {m for e in exprs for m in _SGLANG_RE.findall(e)}


def record_names(exprs: Iterable[str]) -> Set[str]:
    return {m for e in exprs for m in _RECORD_RE.findall(e)}


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def all_rules() -> List[dict]:
    return [r for g in load_yaml(RULES)["groups"] for r in g["rules"]]
