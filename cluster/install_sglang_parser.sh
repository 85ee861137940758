#!/usr/bin/env bash
# Install SGLang 0.5.23's *argument parser* (not its GPU stack) into a venv, so the
# contract tests (tests/contract/sglang/) can parse every launch command raygen builds
# with SGLang's own `ServerArgs.add_cli_args` / `prepare_server_args`.
#
#   cluster/install_sglang_parser.sh [VENV]        # VENV defaults to .venv
#
# Idempotent: a second run checks the pinned versions and exits in well under a second.
#
# Why these packages (measured on SGLang 0.5.23's wheel):
# - sglang==0.5.23 with --no-deps: its full requirement set is the CUDA stack
#   (flashinfer, sglang-kernel, deep-gemm, cuda-python, torch 2.14.1 CUDA, ...).
# - torch, CPU build: `sglang/__init__.py` -> `sglang.srt.utils.common` and ~30 modules on
#   the server_args import path (environ, platforms, runtime_context, arg_groups) import
#   torch at module level, so it cannot be stubbed narrowly. 2.13.0+cpu is the CPU wheel
#   we can get without the CUDA libraries; server_args only needs `import torch` to work
#   (SGLang pins 2.14.1 for its kernels, which never load here).
# - triton is NOT installed (~1 GB unpacked): one module-level `import triton` plus a
#   setattr in sglang/srt/utils/common.py is all the parser path touches; the test puts
#   an empty module in its place for that one import (tests/contract/sglang/conftest.py).
# - the rest are small pure or self-contained wheels imported on that path, installed
#   --no-deps (IPython only for `IPython.display` in sglang/utils.py).
# Measured here: 45-50 s and ~1 GB added to the venv (torch ~750 MB, sglang ~220 MB);
# up to ~2 min when pip must download torch's small deps on a cold cache.
set -euo pipefail

VENV="${1:-.venv}"
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "install_sglang_parser: no python at $PY (create the venv first: make setup)" >&2
  exit 1
fi

SGLANG_PINS=(sglang==0.5.23 msgspec==0.23.0 orjson==3.13.0 pybase64==1.5.1 psutil==7.2.2
             pyzmq==27.3.0 ipython==9.18.1 traitlets==5.16.1)
# The CPU build: a local find-links wheel here, or pass the PyTorch CPU index through
# PIP_EXTRA_INDEX_URL elsewhere. Override with TORCH_SPEC if your platform needs another.
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0+cpu}"

pinned_ok() {  # exit 0 when every NAME==VERSION is installed at exactly it
  "$PY" "$(dirname "$0")/pinned_ok.py" "$@"
}

if pinned_ok "${SGLANG_PINS[@]}" "$TORCH_SPEC"; then
  echo "install_sglang_parser: sglang 0.5.23 parser already installed in $VENV"
  exit 0
fi

start=$(date +%s)
# torch first, with its own small deps (sympy, networkx, jinja2, fsspec, filelock).
if ! "$PY" -m pip install -q "$TORCH_SPEC"; then
  echo "install_sglang_parser: could not install $TORCH_SPEC. Point pip at a CPU wheel" \
       "(PIP_FIND_LINKS / PIP_EXTRA_INDEX_URL) or set TORCH_SPEC=torch==2.13.0" >&2
  exit 1
fi
"$PY" -m pip install -q --no-deps "${SGLANG_PINS[@]}"

# Smoke check: the same import the contract test does, with its one-line triton stand-in.
"$PY" - <<'EOF'
import argparse, importlib.util, sys, types
if importlib.util.find_spec("triton") is None:
    sys.modules["triton"] = types.ModuleType("triton")
from sglang.srt.server_args import ServerArgs
ServerArgs.add_cli_args(argparse.ArgumentParser())
EOF
echo "install_sglang_parser: sglang 0.5.23 parser installed in $VENV in $(( $(date +%s) - start )) s"
