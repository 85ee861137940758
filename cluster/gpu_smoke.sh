#!/usr/bin/env bash
# Smoke run of the config you will run, on one GPU; it fails when the run would
# (cluster/gpu_smoke.py has the details and cluster/smoke_checks.py the checks):
#
#   cluster/gpu_smoke.sh                                   # the B200 config's engine section
#   cluster/gpu_smoke.sh --config jobs/configs/my-run.yaml --model /models/Qwen3.6-27B
#   PYTHON=/opt/venv/bin/python cluster/gpu_smoke.sh       # SGLang in another interpreter
#
# Run from anywhere; it works in the repository it lives in. Exit 0: every check passed;
# 1: a check failed (each named on stderr); 2: this machine cannot run it (a cuda engine
# and no GPU, no SGLang) or the arguments are wrong. After the checks it runs the tuning
# sweep (`raygen tune`: printed, never failing; --tune-seconds 0 skips it). A hard stop
# after SMOKE_TIMEOUT_S (default 1500 s: a 27B model loads in minutes, twice: the smoke's
# engine, then the sweep's).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/.."
PY="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || command -v python3 )}"
exec timeout --kill-after=20 "${SMOKE_TIMEOUT_S:-1500}" "$PY" -m cluster.gpu_smoke "$@"
