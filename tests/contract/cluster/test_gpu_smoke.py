"""cluster/gpu_smoke.sh on this CPU machine, up to the point where it needs the GPU:
its arguments, the model it builds, and the refusal (exit 2, nothing started) when no
NVIDIA GPU is present. (What it runs on a GPU: the configs below, parsed by SGLang's
own parser in tests/contract/sglang/test_sglang_contract.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from cluster import gpu_smoke
from jobs.config import parse_config

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "cluster" / "gpu_smoke.sh"


def smoke(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_help_and_bad_arguments():
    assert smoke("--help").returncode == 0
    bad = smoke("--rows", "0")
    assert bad.returncode == 2 and "must be positive" in bad.stderr


def test_without_a_gpu_it_builds_the_model_then_refuses_and_starts_nothing(tmp_path):
    done = smoke(RAYGEN_MODEL_CACHE=str(tmp_path / "models"))
    assert done.returncode == 2, done.stderr
    assert "cannot run here: no NVIDIA GPU on this machine" in done.stderr
    card = json.loads((tmp_path / "models" / "sampled" / "raygen_model.json").read_text())
    assert card["kind"] == "sampled"  # the model it would serve was built offline
    assert f"model {tmp_path / 'models' / 'sampled'}" in done.stdout
    # refused before the local stack (S3, Ray) was started
    assert "local S3" not in done.stdout and "Ray runtime started" not in done.stdout + done.stderr


def test_a_model_folder_without_a_config_is_refused(tmp_path):
    done = smoke("--model", str(tmp_path))
    assert done.returncode == 2 and "no config.json there" in done.stderr


def test_both_phases_are_valid_run_configs_on_one_gpu(tmp_path):
    model = tmp_path / "m"
    for draft in (None, model):
        cfg = parse_config(gpu_smoke.phase_config(model, draft, tmp_path / "p.jsonl",
                                                  "smoke", 256))
        assert (cfg.engine.kind, cfg.engine.device) == ("sglang", "cuda")
        assert cfg.serve.autoscaling.max_replicas == 1
        assert (cfg.engine.speculative is None) == (draft is None)
        if draft is not None:
            assert cfg.engine.speculative.algorithm == "STANDALONE"
            assert cfg.engine.reserved_tokens == 0  # STANDALONE reserves no output slots
