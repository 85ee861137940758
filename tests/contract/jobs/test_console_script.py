"""The installed `raygen` console script runs and prints every subcommand's help."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from jobs import cli

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_console_script_is_installed_and_prints_help():
    assert PYPROJECT["project"]["scripts"] == {"raygen": "jobs.cli:main"}
    script = Path(sys.executable).parent / "raygen"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in cli.COMMANDS:
        assert f"raygen {name} " in proc.stdout
    assert "exit codes:" in proc.stdout
