"""The GPU image's Python set: raygen's pins and SGLang 0.5.23's declared requirements,
resolved together by pip's own resolver into cluster/image-requirements.txt.

    python -m cluster.image_lock            # resolve afresh (newest allowed versions), rewrite the lock
    python -m cluster.image_lock --check    # re-resolve against the lock; exit 1 naming each difference

What is resolved: pyproject.toml's [project] dependencies plus its gpu extra
(sglang==0.5.23), for the image's interpreter, CPython 3.12 on manylinux x86_64 with
glibc 2.35 or newer (SGLang's docker/Dockerfile installs python3.12; the 0.5.23 image
itself could not be inspected from here, so that is recorded in the lock's header too).

How: `pip install --dry-run --ignore-installed --report` installs nothing and reads
metadata only, never a wheel body: PEP 658 metadata files where the index serves them,
else HTTP range requests into the wheel (--use-feature=fast-deps). Binary wheels only,
with pip's tags and Requires-Python set to the image's (--python-version, --platform).
pip evaluates environment markers against the interpreter it runs on, not against
--python-version, so pip runs here with the image's marker environment put in place of
its own (_RUN_PIP): the lock is the same whichever machine makes it. No pip configuration
of this machine takes part (no config file, no resolution-shaping PIP_* variable), only
PyPI.

--check (and tests/contract/cluster/test_image_dependencies.py) resolves the same
requirements with the lock as constraints: pip must accept the locked versions as a
solution of every declared requirement, and the set it then picks must be the lock's,
package for package. A fresh resolution would move whenever any of the ~200 packages
publishes a release; this one moves only when raygen's pins, SGLang's requirements or
the lock do.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "cluster" / "image-requirements.txt"
INDEX = "https://pypi.org/simple/"
SGLANG = "sglang==0.5.23"

# The image's interpreter and platform.
PYTHON = "3.12"
GLIBC_MINOR = 35  # Ubuntu 22.04's glibc; 24.04 (2.39) runs every wheel this allows
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
# The marker environment of that interpreter (PEP 508 names); the rest is pip's own.
MARKERS = {
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": PYTHON,
    "python_full_version": f"{PYTHON}.3",  # assumed; only python_full_version markers read it
    "implementation_version": f"{PYTHON}.3",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
}

# pip, with the image's marker environment in place of this interpreter's.
_RUN_PIP = """
import json, sys
from pip._vendor.packaging import markers
image = json.loads(sys.argv[1])
here = markers.default_environment
markers.default_environment = lambda: {**here(), **image}
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""

# PIP_* variables that reach the network only (certificates, proxy, cache, timeouts);
# every other one (index, find-links, constraints, pre-releases...) would shape the result.
_PIP_NETWORK_ENV = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_CACHE_DIR",
                    "PIP_NO_CACHE_DIR", "PIP_DEFAULT_TIMEOUT", "PIP_TIMEOUT", "PIP_RETRIES",
                    "PIP_DISABLE_PIP_VERSION_CHECK"}


class ResolutionFailed(Exception):
    """pip found no set: its own explanation (the conflicting packages) is the message."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """What the image holds besides the base: raygen's dependencies and the gpu extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["gpu"]]


def pins(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """{canonical name: version} of every requirement of requirements() (all are `==`)."""
    out = {}
    for req in requirements(pyproject):
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*",
                         req)
        if not m:
            raise ValueError(f"not an exact pin: {req!r}")
        out[canonical(m.group(1))] = m.group(3)
    return out


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """{canonical name: version} of the lock's `name==version` lines."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep:
                raise ValueError(f"{path.name}: not NAME==VERSION: {line!r}")
            out[canonical(name)] = version.strip()
    return out


def render(packages: dict[str, str], pip_version: str) -> str:
    today = datetime.date.today().isoformat()
    header = f"""\
# The GPU image's Python set: raygen's pins (pyproject.toml [project] dependencies) and
# {SGLANG}'s declared requirements (the gpu extra), resolved together by pip's resolver
# (pip {pip_version}, {today}, PyPI) for CPython {PYTHON} on manylinux x86_64, glibc >= 2.{GLIBC_MINOR}.
# CPython {PYTHON}: SGLang's docker/Dockerfile installs python3.12; the {SGLANG.split("==")[1]} image
# itself was not inspected where this was made.
# Generated by `python -m cluster.image_lock`: do not edit. cluster/Dockerfile installs
# raygen with it as constraints; tests/contract/cluster/test_image_dependencies.py checks
# it against pyproject.toml and re-resolves it.
"""
    body = "".join(f"{name}=={packages[name]}\n" for name in sorted(packages))
    return header + body


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") or k in _PIP_NETWORK_ENV}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf of this machine or user
    return env


def pip_args(reqs: Path, report: Path, constraints: Path | None) -> list[str]:
    args = ["install", "--dry-run", "--ignore-installed", "--report", str(report),
            "--index-url", INDEX, "--use-feature=fast-deps", "--only-binary=:all:",
            "--implementation", "cp", "--python-version", PYTHON,
            *[a for p in PLATFORMS for a in ("--platform", p)], "-r", str(reqs)]
    if constraints is not None:
        args += ["-c", str(constraints)]
    return args


def resolve(constraints: Path | None = None, *, pyproject: Path = PYPROJECT,
            timeout: float = 600) -> dict[str, str]:
    """{canonical name: version} of the set pip's resolver picks (nothing installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        reqs, report = Path(tmp) / "requirements.txt", Path(tmp) / "report.json"
        reqs.write_text("\n".join(requirements(pyproject)) + "\n")
        done = subprocess.run(
            [sys.executable, "-c", _RUN_PIP, json.dumps(MARKERS),
             *pip_args(reqs, report, constraints)],
            env=pip_env(), cwd=tmp, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise ResolutionFailed(_explanation(done.stdout, done.stderr))
        installs = json.loads(report.read_text())["install"]
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def _explanation(stdout: str, stderr: str) -> str:
    """pip's errors (stderr) and its account of the conflict (stdout), without its
    progress lines and the fast-deps warning."""
    errors = "\n".join(line for line in stderr.splitlines()
                       if line.strip() and "lazily downloaded wheels" not in line)
    at = stdout.find("The conflict is caused by")
    return (errors[-3000:] + ("\n" + stdout[at:at + 6000].rstrip() if at >= 0 else "")).strip()


def differences(lock: dict[str, str], resolved: dict[str, str]) -> list[str]:
    """One line per package the lock has otherwise than pip's resolution."""
    out = []
    for name in sorted(lock.keys() | resolved.keys()):
        if name not in resolved:
            out.append(f"{name}=={lock[name]}: in the lock, not in pip's resolution")
        elif name not in lock:
            out.append(f"{name}=={resolved[name]}: pip resolves it, the lock lacks it")
        elif lock[name] != resolved[name]:
            out.append(f"{name}: lock {lock[name]}, pip {resolved[name]}")
    return out


def index_reachable(timeout: float = 5) -> str | None:
    """None when the index answers a HEAD in time, else why not."""
    try:
        urllib.request.urlopen(urllib.request.Request(INDEX + "pip/", method="HEAD"),
                               timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as exc:
        return f"{INDEX} not reachable in {timeout:g} s ({exc})"
    return None


def pip_version() -> str:
    from pip import __version__
    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.image_lock", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="re-resolve with the lock as constraints; exit 1 on any difference")
    args = parser.parse_args(argv)
    try:
        if args.check:
            diff = differences(read_lock(), resolve(constraints=LOCK))
            for line in diff:
                print(line)
            print(f"{LOCK.relative_to(REPO)}: " + ("differs from pip's resolution" if diff
                                                   else "pip's resolution, unchanged"))
            return 1 if diff else 0
        resolved = resolve()
    except ResolutionFailed as exc:
        print(f"pip's resolver found no set:\n{exc}", file=sys.stderr)
        return 1
    LOCK.write_text(render(resolved, pip_version()))
    print(f"{LOCK.relative_to(REPO)}: {len(resolved)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
