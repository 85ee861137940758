#!/usr/bin/env bash
# Install what SGLang 0.5.23's *request path* imports on CPU, on top of the parser install
# (cluster/install_sglang_parser.sh): its real FastAPI app, TokenizerManager,
# DetokenizerManager, Req finish logic and metrics collector. The oracle tests
# (tests/contract/sglang/test_sglang_oracle.py, test_sglang_differential.py) run that code
# with a fake scheduler and compare raygen's client and the simulator against it.
#
# The same set runs SGLang's real engine on a CPU (`engine.device: cpu`: tests/integration/
# sglang/, `make run`): with raygen's CPU shims on the engine's path (serve_apps/engines/
# sglang_cpu/), `python -m sglang.launch_server` needs nothing more. Its server stack
# (fastapi, uvicorn, uvloop, starlette) is the one Ray Serve installed, at Ray's versions:
# one venv, as in the GPU image (tests/contract/sglang/test_install.py runs `pip check`).
#
#   cluster/install_sglang_oracle.sh [VENV]        # VENV defaults to .venv
#
# Idempotent: when every pin is installed it exits in about a second.
# Every package is pinned and installed --no-deps, so the set is exactly this list on any
# machine (SGLang's own pins where it has one: transformers, tokenizers, openai, xgrammar,
# sentencepiece, soundfile, compressed-tensors, apache-tvm-ffi; the rest at the versions
# this was verified with). Why the odd ones:
# - triton is real (~700 MB): an empty stand-in breaks torch._dynamo, which
#   the scheduler-side imports reach.
# - torchvision from PyPI is a CUDA build whose _C cannot load with CPU torch; the tests
#   define its two op schemas before import (tests/contract/sglang/sglang_stack.py).
# Measured here: ~1.2 GB more in the venv; 60-90 s from a warm pip cache.
set -euo pipefail

VENV="${1:-.venv}"
PY="$VENV/bin/python"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

bash "$HERE/install_sglang_parser.sh" "$VENV"

RUNTIME_PINS=(
  transformers==5.19.0 tokenizers==0.23.2 huggingface_hub==1.33.0 hf-xet==1.8.0
  safetensors==0.8.0 openai==2.8.0 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0
  triton==3.7.0 torchvision==0.28.0 gguf==0.19.0 xgrammar==0.2.7 soundfile==0.13.1
  scipy==1.17.1 sentencepiece==0.2.1 tiktoken==0.14.0 dill==0.4.1 einops==0.8.2
  setproctitle==1.3.8 partial-json-parser==0.2.1.1.post7 python-multipart==0.0.34
  zstandard==0.25.0 loguru==0.7.3 httpx==0.28.1 httpcore==1.0.9 distro==1.9.0
  jiter==0.19.0 sniffio==1.3.1 typer==0.29.2 rich==15.0.0 markdown-it-py==4.3.0
  mdurl==0.1.2 shellingham==1.5.4
)

pinned_ok() {  # exit 0 when every NAME==VERSION is installed at exactly it
  "$PY" "$(dirname "$0")/pinned_ok.py" "$@"
}

if pinned_ok "${RUNTIME_PINS[@]}"; then
  echo "install_sglang_oracle: SGLang 0.5.23 runtime imports already installed in $VENV"
  exit 0
fi

start=$(date +%s)
"$PY" -m pip install -q --no-deps "${RUNTIME_PINS[@]}"
echo "install_sglang_oracle: SGLang 0.5.23 runtime imports installed in $VENV in" \
     "$(( $(date +%s) - start )) s"
