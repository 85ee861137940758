"""Import direction: jobs -> serve_apps -> contract, jobs -> contract. serve_apps never
imports jobs; contract imports neither. Read from the source with ``ast`` (every file,
also imports inside functions), so nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package, forbidden", [
    ("serve_apps", {"jobs"}),
    ("contract", {"jobs", "serve_apps"}),
])
def test_lower_layers_do_not_import_upper_ones(package, forbidden):
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no sources under {package}/"
    offenders = {str(f.relative_to(REPO)): sorted(_imported_packages(f) & forbidden)
                 for f in files if _imported_packages(f) & forbidden}
    assert offenders == {}


def test_the_check_sees_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n"
                      "    from jobs.config import load_config\n"
                      "    import serve_apps.app\n")
    assert _imported_packages(source) == {"jobs", "serve_apps"}
