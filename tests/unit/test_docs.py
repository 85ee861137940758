"""Docs that must match the code: the README's output schema and the config reference."""

import re
from pathlib import Path

import pytest

from jobs import config_doc, generate
from jobs.io.schema import DATA

ROOT = Path(__file__).resolve().parents[2]


def test_readme_documents_every_output_column_in_order():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Output schema", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert documented == DATA.names


def test_config_reference_is_generated_from_the_code(capsys):
    assert config_doc.main(["--check"]) == 0, capsys.readouterr().err


def test_readme_commands_exist(capsys):
    readme = (ROOT / "README.md").read_text()
    for module in set(re.findall(r"python -m (jobs(?:\.[a-z_]+)+)", readme)):
        assert (ROOT / (module.replace(".", "/") + ".py")).exists(), module
    with pytest.raises(SystemExit):
        generate.parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--retry-failed", "--continue-truncated", "--max-total-tokens", "--pilot"):
        assert flag in out
