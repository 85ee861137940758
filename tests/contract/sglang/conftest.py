"""SGLang 0.5.23's own code, loaded once per session for the contract tests.

cluster/install_sglang_oracle.sh (run by ``make setup``) installs sglang==0.5.23 --no-deps,
the CPU torch and the pinned packages its CPU request path imports (triton included).
Two things are done narrowly here, and undone after the import:

- with only the parser install (cluster/install_sglang_parser.sh, no triton), an empty
  module stands in for ``sglang/srt/utils/common.py``'s module-level ``import triton``
  and is removed from ``sys.modules`` again; with the oracle install it is not needed.
- ``import sglang`` sets default cache-dir variables in ``os.environ``
  (``redirect_third_party_caches``); the environment is restored afterwards so other
  tests' subprocesses do not inherit them.

A missing or wrong SGLang fails (never skips) with the command that fixes it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import types
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest

from tests.support.sglang import ORACLE_CONTEXT, ORACLE_MEDIAN_TOKENS, ORACLE_SIGMA, RaisingParser

REPO = Path(__file__).resolve().parents[3]
SGLANG_VERSION = "0.5.23"
INSTALL_HINT = (f"SGLang {SGLANG_VERSION}'s parser and CPU runtime imports are needed by the "
                f"production tests: run `cluster/install_sglang_oracle.sh .venv` (`make setup` does)")


def _import_sglang() -> types.SimpleNamespace:
    try:
        installed = version("sglang")
    except PackageNotFoundError:
        pytest.fail(f"sglang is not installed. {INSTALL_HINT}", pytrace=False)
    if installed != SGLANG_VERSION:
        pytest.fail(f"sglang {installed} is installed, the contract is {SGLANG_VERSION}. "
                    f"{INSTALL_HINT}", pytrace=False)
    saved_env = dict(os.environ)
    from tests.contract.sglang import sglang_cpu  # noqa: F401  (torchvision hook first)
    stub = importlib.util.find_spec("triton") is None
    if stub:
        sys.modules["triton"] = types.ModuleType("triton")
    try:
        from sglang.api.v1 import api_types
        from sglang.srt import server_args
    except ImportError as exc:
        pytest.fail(f"cannot import SGLang's server_args ({exc}). {INSTALL_HINT}", pytrace=False)
    finally:
        if stub:
            sys.modules.pop("triton", None)
        os.environ.clear()
        os.environ.update(saved_env)
    return types.SimpleNamespace(server_args=server_args, api_types=api_types,
                                 srt=Path(server_args.__file__).parent)


@pytest.fixture(scope="session")
def sglang() -> types.SimpleNamespace:
    """``.server_args``, ``.api_types`` (sglang.api.v1) and ``.srt`` (the sglang/srt folder)."""
    return _import_sglang()


@pytest.fixture(scope="session")
def sglang_parser(sglang) -> argparse.ArgumentParser:
    """SGLang's launch-server parser, built exactly as ``prepare_server_args`` builds it."""
    parser = RaisingParser(prog="sglang serve")
    sglang.server_args.ServerArgs.add_cli_args(parser)
    return parser



# --- SGLang's real HTTP stack (tests/contract/sglang/sglang_stack.py) ---------------------

STACK_START_TIMEOUT_S = 300.0  # SGLang's import alone is ~7 s idle; the CI machine is shared


# Package scope: the stack stops after this folder's last test, not at the end of the run.
@pytest.fixture(scope="package")
def sglang_stack(tmp_path_factory) -> Any:
    """Base URL of SGLang 0.5.23's FastAPI app under uvicorn (keep-alive 5 s), fake scheduler.

    RAYGEN_SGLANG_STACK=URL reuses a stack started by hand (`python -m
    tests.contract.sglang.sglang_stack --port-file F`) while iterating on these tests.
    """
    import signal
    import subprocess
    import time
    import urllib.request

    if os.environ.get("RAYGEN_SGLANG_STACK"):
        yield types.SimpleNamespace(base=os.environ["RAYGEN_SGLANG_STACK"], output=lambda: "")
        return
    workdir = tmp_path_factory.mktemp("sglang-stack")
    port_file = workdir / "port"
    log = open(workdir / "stack.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.contract.sglang.sglang_stack",
         "--context-length", str(ORACLE_CONTEXT), "--median-tokens", str(ORACLE_MEDIAN_TOKENS),
         "--sigma", str(ORACLE_SIGMA), "--model-dir", str(workdir / "model"),
         "--port-file", str(port_file)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def output() -> str:
        log.seek(0)
        return log.read()[-4000:]

    try:
        deadline = time.monotonic() + STACK_START_TIMEOUT_S
        while not port_file.exists():
            if proc.poll() is not None:
                pytest.fail(f"SGLang stack exited with {proc.returncode}:\n{output()}\n"
                            f"{INSTALL_HINT}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"SGLang stack not up after {STACK_START_TIMEOUT_S:.0f} s:\n{output()}",
                            pytrace=False)
            time.sleep(0.2)
        base = f"http://127.0.0.1:{int(port_file.read_text())}"
        with urllib.request.urlopen(base + "/health", timeout=30) as resp:
            assert resp.status == 200
        yield types.SimpleNamespace(base=base, model_dir=workdir / "model", output=output)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        log.close()
