"""Import direction: jobs -> serve_apps -> contract, jobs -> contract. serve_apps never
imports jobs; contract imports neither. Inside jobs/, its layers import downward only
(config < io < pipeline < analysis < runs < entry points). Read from the source with
``ast`` (every file, also imports inside functions), so nothing is imported to check it."""

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


# jobs/'s own layers, lowest first (jobs/README.md): a module imports from its own layer
# and the ones below it. config.py is under every layer (they all read the run config);
# the entry points (cli.py, generate.py, demo_prompts.py, config_doc.py) sit on top.
# runs/ is above analysis/: a session ends by writing the report (analysis.report);
# analysis/ only reads what a run stored.
JOBS_LAYERS = ("config", "io", "pipeline", "analysis", "runs", "entry")


def _jobs_layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "jobs" or len(parts) < 2:
        return None  # not jobs/, or the bare package
    if parts[1] in JOBS_LAYERS[1:-1]:
        return parts[1]
    return "config" if parts[1] == "config" else "entry"


def _module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, root: Path) -> set[str]:
    """Every module a file imports, by its full dotted name; ``from a import b`` counts
    as a and a.b (b may be a submodule); relative imports are resolved."""
    package = _module_of(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _jobs_layer_violations(root: Path) -> dict[str, list[str]]:
    offenders = {}
    for path in sorted((root / "jobs").rglob("*.py")):
        module = _module_of(path, root)
        own = JOBS_LAYERS.index(_jobs_layer(module) or "entry")
        upward = sorted(m for m in _imported_modules(path, root)
                        if _jobs_layer(m) and JOBS_LAYERS.index(_jobs_layer(m)) > own)
        if upward:
            offenders[module] = upward
    return offenders


def test_jobs_layers_import_only_downward():
    layers = {_jobs_layer(_module_of(p, REPO)) for p in (REPO / "jobs").rglob("*.py")}
    assert layers - {None} == set(JOBS_LAYERS)  # every layer exists: the map is current
    assert _jobs_layer_violations(REPO) == {}


def test_the_layer_check_sees_upward_imports_anywhere_in_a_file(tmp_path):
    for layer in ("io", "runs"):
        (tmp_path / "jobs" / layer).mkdir(parents=True)
    (tmp_path / "jobs" / "io" / "low.py").write_text(
        "import jobs.io.storage\n"
        "from jobs.config import StorageConfig\n"
        "def f():\n"
        "    from jobs.runs.lease import RunLease\n"
        "class C:\n"
        "    def g(self):\n"
        "        from ..pipeline import rows\n"
        "        from jobs import generate\n")
    (tmp_path / "jobs" / "runs" / "high.py").write_text(
        "from jobs.io import storage\nfrom jobs.analysis.report import report_and_write\n")
    assert _jobs_layer_violations(tmp_path) == {"jobs.io.low": [
        "jobs.generate", "jobs.pipeline", "jobs.pipeline.rows", "jobs.runs.lease",
        "jobs.runs.lease.RunLease"]}
