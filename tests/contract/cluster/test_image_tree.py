"""The GPU image's file tree, assembled from cluster/Dockerfile itself, holds raygen.

No Docker engine runs here, so the build is reproduced where it can fail without one:
the Dockerfile's own ``COPY`` lines (parsed, not restated) copy the repository's
tracked files, minus .dockerignore, into a temp /app; every package pyproject.toml
installs must be there; and the Dockerfile's own ``python -c`` import checks run in a
fresh interpreter on that tree only (raygen's editable install switched off), the SGLang
one against the oracle install. A moved module or a new top-level package then fails
here, not in `docker build` on the cluster. (`pip install .` and the CUDA base image
are what this cannot run.)
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "cluster" / "Dockerfile"
SHIMS = REPO / "serve_apps" / "engines" / "sglang_cpu" / "shims"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines()
                                             if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule for these patterns: a match of the path or a parent."""
    parts = rel.split("/")
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        for i in range(1, len(parts) + 1):
            if fnmatch.fnmatch("/".join(parts[:i]), pattern) or (
                    pattern.startswith("**/") and fnmatch.fnmatch(parts[i - 1], pattern[3:])):
                return True
    return False


def build_context() -> list[str]:
    """The files `docker build .` sends from a fresh clone: tracked files, minus
    .dockerignore."""
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True,
                             text=True, check=True).stdout.split()
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in ignore if p.strip() and not p.startswith("#")]
    return [rel for rel in tracked if (REPO / rel).exists() and not _ignored(rel, patterns)]


def assemble(dockerfile: str, dest: Path) -> Path:
    """The image's WORKDIR as the Dockerfile's COPY lines fill it."""
    context = build_context()
    workdir = None
    for word, args in _instructions(dockerfile):
        if word == "WORKDIR":
            workdir = dest / args.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif word == "COPY":
            *sources, target = [a for a in shlex.split(args) if not a.startswith("--")]
            assert workdir is not None, "COPY before WORKDIR"
            for src in sources:
                src = src.rstrip("/")
                files = [rel for rel in context if rel == src or rel.startswith(src + "/")]
                assert files, f"COPY {src}: nothing in the build context"
                for rel in files:
                    if rel == src:  # a file: into the target folder (or as the target)
                        to = workdir / target / Path(rel).name if target.endswith("/") \
                            else workdir / target
                    else:
                        to = workdir / target / Path(rel).relative_to(src)
                    to.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / rel, to)
    assert workdir is not None, "no WORKDIR"
    return workdir


def missing_packages(app: Path) -> list[str]:
    """Top-level packages pyproject.toml installs (packages.find include) that the
    image's tree lacks."""
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    wanted = sorted({p.parent.name for p in REPO.glob("*/__init__.py")
                     if any(fnmatch.fnmatch(p.parent.name, pat) for pat in include)})
    assert wanted, include
    return [name for name in wanted if not (app / name / "__init__.py").is_file()]


def import_checks(dockerfile: str) -> list[str]:
    """The code of every `python -c "..."` in the Dockerfile's RUN lines."""
    codes = []
    for word, args in _instructions(dockerfile):
        if word == "RUN":
            for command in args.split("&&"):
                argv = shlex.split(command)
                if argv[:2] == ["python", "-c"]:
                    codes.append(argv[2])
    return codes


# Run a Dockerfile check on the assembled tree only: drop the editable install's finder
# (it would find a package the tree lacks in this checkout) before running the code.
_ON_TREE_ONLY = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
exec(compile(sys.argv[1], "<Dockerfile>", "exec"))
for name in ("serve_apps", "jobs", "contract"):
    module = sys.modules.get(name)
    if module is not None:
        assert module.__file__.startswith(sys.argv[2]), (name, module.__file__)
"""


def run_check(code: str, app: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(app), "RAY_USAGE_STATS_ENABLED": "0"}
    if "sglang" in code:
        # The GPU image has a CUDA torchvision; here the CPU engine's hook stands in.
        env.update(PYTHONPATH=str(SHIMS), SGLANG_USE_CPU_ENGINE="1")
    return subprocess.run([sys.executable, "-c", _ON_TREE_ONLY, code, str(app)], cwd=app,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_image_tree_holds_every_package_and_passes_the_dockerfiles_checks(tmp_path):
    text = DOCKERFILE.read_text()
    app = assemble(text, tmp_path / "image")
    assert missing_packages(app) == []
    assert (app / "pyproject.toml").is_file()
    assert not (app / "serve_apps/engines/sglang_cpu/shims").exists()  # never in the image
    codes = import_checks(text)
    assert len(codes) >= 3 and any("sglang" in c for c in codes), codes
    for code in codes:
        done = run_check(code, app)
        assert done.returncode == 0, f"Dockerfile check failed on the image tree:\n{code}\n" \
                                     f"{done.stderr[-3000:]}"


@pytest.mark.parametrize("package", ["contract", "serve_apps", "jobs", "cluster", "dashboards"])
def test_deleting_a_copy_line_fails_the_tree(tmp_path, package):
    text = DOCKERFILE.read_text()
    line = f"COPY {package} ./{package}\n"
    assert line in text
    app = assemble(text.replace(line, ""), tmp_path / "image")
    assert missing_packages(app) == [package]


def test_a_moved_module_fails_the_dockerfiles_import_check(tmp_path):
    app = assemble(DOCKERFILE.read_text(), tmp_path / "image")
    (app / "jobs" / "runs" / "run.py").rename(app / "jobs" / "runs" / "session.py")
    failed = [code for code in import_checks(DOCKERFILE.read_text())
              if "jobs" in code and run_check(code, app).returncode != 0]
    assert failed, "the Dockerfile's import checks should notice jobs.runs.run is gone"
