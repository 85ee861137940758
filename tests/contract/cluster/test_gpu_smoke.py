"""cluster/gpu_smoke.sh on this CPU machine, up to where a cuda engine needs the GPU: its
arguments, the refusals (exit 2, nothing started), and the run config it makes of the
user's config. (The checks failing on SGLang's real CPU engine, one bad config each:
tests/integration/sglang/test_gpu_smoke_cpu.py; the checks themselves:
tests/unit/cluster/test_smoke_checks.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cluster import gpu_smoke
from cluster.smoke_checks import rows_in_flight_per_engine
from jobs.config import load_config, parse_config

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "cluster" / "gpu_smoke.sh"


def smoke(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_help_and_bad_arguments():
    assert smoke("--help").returncode == 0
    bad = smoke("--rows", "0")
    assert bad.returncode == 2 and "must be positive" in bad.stderr


def test_the_b200_config_without_a_gpu_is_refused_before_anything_starts():
    done = smoke()
    assert done.returncode == 2, done.stderr
    assert "qwen36-27b-b200.yaml, engine Qwen/Qwen3.6-27B on cuda" in done.stdout
    assert "cannot run here: no NVIDIA GPU on this machine" in done.stderr
    assert "Ray runtime started" not in done.stdout + done.stderr


def test_a_model_folder_without_a_config_or_a_bad_config_is_refused(tmp_path):
    done = smoke("--model", str(tmp_path))
    assert done.returncode == 2 and "--model" in done.stderr and "no config.json there" in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: {kind: sglang}\n")
    done = smoke("--config", str(bad))
    assert done.returncode == 2 and f"--config {bad}" in done.stderr
    done = smoke("--prompts", str(tmp_path / "missing.jsonl"))
    assert done.returncode == 2 and "--prompts" in done.stderr


def test_the_smoke_runs_the_configs_engine_with_one_engines_rows_in_flight(tmp_path):
    path = REPO / "jobs" / "configs" / "qwen36-27b-b200.yaml"
    planned = load_config(str(path))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    tree = gpu_smoke.smoke_tree(str(path), str(model), None, tmp_path / "p.jsonl",
                                str(tmp_path / "out"), "smoke-x")
    cfg = parse_config(tree)
    # the engine section as the user will run it, the model path aside
    assert cfg.engine.model_dump(exclude={"model_path"}) == \
        planned.engine.model_dump(exclude={"model_path"})
    assert cfg.engine.model_path == str(model)
    assert (cfg.serve.autoscaling.min_replicas, cfg.serve.autoscaling.max_replicas) == (1, 1)
    # one engine holds what each of the real run's engines holds, at the same budget
    assert rows_in_flight_per_engine(cfg) == rows_in_flight_per_engine(planned)
    assert cfg.job.max_new_tokens == planned.job.max_new_tokens
    assert cfg.job.sampling == planned.job.sampling
    assert cfg.job.output == str(tmp_path / "out") and cfg.storage.endpoint_url is None
