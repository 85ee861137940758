"""One venv for raygen and SGLang's real engine: what `make setup` installs holds together.

SGLang 0.5.23 is installed --no-deps (its requirement set is the CUDA stack), so `pip
check` names its missing GPU packages and its CUDA torch pin; that is all it may name.
Any other finding (a version conflict between SGLang's server stack and Ray Serve's, a
requirement of Ray or raygen unmet) fails here, not in a replica.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

SGLANG = "sglang 0.5.23"


def _allowed(line: str) -> bool:
    if re.fullmatch(rf"{SGLANG} requires [\w.-]+, which is not installed\.", line):
        return True  # SGLang's GPU stack (flashinfer, sglang-kernel, ...): never on CPU
    if line == f"{SGLANG} has requirement torch==2.14.1, but you have torch {version('torch')}.":
        return version("torch").endswith("+cpu")  # the CPU build of the same major line
    # IPython: only IPython.display is imported on SGLang's path (install_sglang_parser.sh)
    return bool(re.fullmatch(r"ipython [\d.]+ requires [\w.-]+, which is not installed\.", line))


def test_pip_check_finds_nothing_but_sglangs_gpu_stack():
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                          text=True)
    findings = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    assert findings, "expected SGLang's missing GPU packages to be listed"
    assert [line for line in findings if not _allowed(line)] == []

