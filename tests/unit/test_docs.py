"""Docs that must match the code: the README's output schema and the config reference."""

import re
import subprocess
import sys
from pathlib import Path

from jobs.io.schema import DATA

ROOT = Path(__file__).resolve().parents[2]


def test_readme_documents_every_output_column_in_order():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Output schema", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert documented == DATA.names


def test_config_reference_is_generated_from_the_code():
    result = subprocess.run([sys.executable, "-m", "jobs.config_doc", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_readme_commands_exist():
    readme = (ROOT / "README.md").read_text()
    for module in set(re.findall(r"python -m (jobs(?:\.[a-z_]+)+)", readme)):
        assert (ROOT / (module.replace(".", "/") + ".py")).exists(), module
    for flag in ("--retry-failed", "--continue-truncated", "--max-total-tokens", "--pilot"):
        out = subprocess.run([sys.executable, "-m", "jobs.generate", "--help"], cwd=ROOT,
                             capture_output=True, text=True).stdout
        assert flag in out
