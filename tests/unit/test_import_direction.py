"""Import direction: jobs -> serve_apps -> contract, jobs -> contract. serve_apps never
imports jobs; contract imports neither. Inside jobs/, its layers import downward only
(config < io < pipeline < analysis < runs < entry points). No project modules import
each other in a circle, however hidden (a function-local import). A project module
imported inside a function says why on its line or the line above. Read from the source
with ``ast`` (every file, also imports inside functions), so nothing is imported to check
it."""

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


def _package_of(path: Path, root: Path) -> list[str]:
    """The dotted parts of the package a file's relative imports start from."""
    parts = _module_of(path, root).split(".")
    return parts if path.name == "__init__.py" else parts[:-1]


def _from_module(node: ast.ImportFrom, package: list[str]) -> str:
    """The module a ``from ... import`` names, relative levels resolved."""
    base = package[:len(package) - node.level + 1] if node.level else []
    return ".".join(base + ([node.module] if node.module else []))


def _imported_modules(path: Path, root: Path) -> set[str]:
    """Every module a file imports, by its full dotted name; ``from a import b`` counts
    as a and a.b (b may be a submodule); relative imports are resolved."""
    package = _package_of(path, root)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, package)
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


# --- no import circles ------------------------------------------------------------------
# Two modules that import each other (one of them inside a function, to dodge the
# circular import at load time) are one module in two files: the analysis circles of
# issue 38 (export <-> incremental_export, forecast <-> token_yield) were that. Imports
# under ``if TYPE_CHECKING:`` are annotations only and never run: they do not count.
PROJECT_PACKAGES = ("jobs", "serve_apps", "contract", "cluster", "dashboards", "bench")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(path: Path, root: Path, modules: set[str]) -> set[str]:
    """The project modules a file imports when it runs, anywhere in it (functions too):
    ``from pkg import sub`` is the module pkg.sub alone when sub is one, else pkg."""
    package = _package_of(path, root)
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, package)
            subs = {f"{module}.{alias.name}" for alias in node.names} & modules
            found.update(subs if len(subs) == len(node.names) else subs | {module})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found & modules


def _import_circles(root: Path) -> list[list[str]]:
    """Every set of project modules that import one another in a circle (Tarjan's
    strongly connected components of the import graph, those of two or more)."""
    files = {_module_of(p, root): p for pkg in PROJECT_PACKAGES if (root / pkg).is_dir()
             for p in (root / pkg).rglob("*.py")}
    modules = set(files)
    graph = {m: _runtime_imports(p, root, modules) - {m} for m, p in files.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def strong(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            strong(v)
    return circles


def test_no_two_project_modules_import_each_other():
    assert _import_circles(REPO) == []


def test_the_circle_check_sees_a_circle_closed_inside_a_function(tmp_path):
    (tmp_path / "jobs" / "analysis").mkdir(parents=True)
    (tmp_path / "jobs" / "analysis" / "export.py").write_text(
        "from jobs.analysis import incremental_export\n")
    (tmp_path / "jobs" / "analysis" / "incremental_export.py").write_text(
        "def f():\n    from jobs.analysis.export import write\n")
    (tmp_path / "jobs" / "analysis" / "report.py").write_text(  # annotations only: no circle
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from jobs.analysis.forecast import Forecast\n")
    (tmp_path / "jobs" / "analysis" / "forecast.py").write_text(
        "from jobs.analysis.report import rounded\n")
    assert _import_circles(tmp_path) == [
        ["jobs.analysis.export", "jobs.analysis.incremental_export"]]


# --- a function-local import says why ---------------------------------------------------
# A project module imported inside a function hides a dependency from the file's top
# (issue 38 item 3). It stays local only for a reason, given in a comment on its line or
# the line above (one line for each import: "# local: as above" for the next of a group):
# an entry point's import cost (tests/contract/jobs/test_lazy_imports.py pins
# jobs.generate's and raygen's parser's), an optional dependency, a package's submodule
# that imports the package back. The service's packages only: bench/ and cluster/'s
# scripts (gpu_smoke, the benchmarks) import the stack when a step runs, as scripts do.
REASONED_PACKAGES = ("jobs", "serve_apps", "contract")


def _imports_a_project_module(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] in PROJECT_PACKAGES
    return isinstance(node, ast.Import) and any(
        alias.name.split(".")[0] in PROJECT_PACKAGES for alias in node.names)


def _unexplained_local_imports(root: Path) -> list[str]:
    """path:line of every function-local import of a project module with no comment on
    its lines or a comment line right above it."""
    found = set()
    for package in REASONED_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if not _imports_a_project_module(node):
                        continue
                    own = lines[node.lineno - 1:node.end_lineno]
                    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                    if not any("#" in line for line in own) and not above.startswith("#"):
                        found.add((str(path.relative_to(root)), node.lineno))
    return [f"{path}:{line}" for path, line in sorted(found)]


def test_every_function_local_import_of_a_project_module_says_why():
    assert _unexplained_local_imports(REPO) == []


def test_the_reason_check_sees_a_bare_local_import(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "serve_apps").mkdir()
    (tmp_path / "jobs" / "m.py").write_text(
        "from jobs.config import load_config\n"          # the top: not asked
        "def f():\n"
        "    from jobs.io.storage import locate\n"      # 3: bare
        "    import json\n"                             # not a project module
        "def g():\n"
        "    # local: pulls in ray\n"
        "    from jobs.runs.run import run_job\n"
        "    from jobs.io import storage  # local: as above\n"
        "    import serve_apps.app\n"                   # 9: bare (the line above is code)
        "    from . import sibling\n"                   # 10: relative, bare
        "    from contract.protocol import (GenerateRequest,  # local: a reason\n"
        "                                   GenerateResult)\n"
        "class C:\n"
        "    async def h(self):\n"
        "        def inner():\n"
        "            from contract.outcomes import route\n")  # 16: bare, seen once
    (tmp_path / "serve_apps" / "s.py").write_text(
        "def f(x):\n    if x:\n        from serve_apps.engines import sglang\n")
    assert _unexplained_local_imports(tmp_path) == [
        "jobs/m.py:3", "jobs/m.py:9", "jobs/m.py:10", "jobs/m.py:16", "serve_apps/s.py:3"]
