#!/usr/bin/env bash
# GPU smoke run of raygen's real SGLang path, bounded to 10 minutes, leaving nothing
# running (cluster/gpu_smoke.py has the details):
#
#   cluster/gpu_smoke.sh                          # the tiny model raygen builds, spec off then on
#   cluster/gpu_smoke.sh --model /models/Qwen3-0.6B --no-spec
#   PYTHON=/opt/venv/bin/python cluster/gpu_smoke.sh   # SGLang in another interpreter
#
# Run from anywhere; it works in the repository it lives in. Exit 0: every phase ran;
# 1: a phase failed (its error printed); 2: this machine cannot run it (no GPU, no SGLang).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/.."
PY="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || command -v python3 )}"
# The Python side stops at its own deadline (570 s); this is the hard stop behind it.
exec timeout --kill-after=20 600 "$PY" -m cluster.gpu_smoke "$@"
