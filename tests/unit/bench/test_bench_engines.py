"""`python -m bench --engine`: the same benchmark on the simulator or on SGLang's real
CPU engine; the config each builds is a valid run config of that engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import run as bench_run
from jobs.config import parse_config


def test_simulator_is_the_default_engine(tmp_path):
    opt = bench_run.parse_args(["--prompts", "10"])
    cfg = parse_config(bench_run.config_tree(opt, tmp_path / "p.jsonl", 64))
    assert (cfg.engine.kind, cfg.job.max_new_tokens) == ("simulator", 4096)


def test_sglang_cpu_engine_runs_the_sampled_model_with_plain_sampling(tmp_path, monkeypatch):
    from serve_apps.engines.sglang_cpu import models
    monkeypatch.setattr(models, "ensure", lambda kind: Path("/cache") / kind)  # no build here
    opt = bench_run.parse_args(["--engine", "sglang-cpu", "--max-running", "16"])
    cfg = parse_config(bench_run.config_tree(opt, tmp_path / "p.jsonl", 32))
    assert (cfg.engine.kind, cfg.engine.device, cfg.engine.model_path) == \
        ("sglang", "cpu", "/cache/sampled")
    assert cfg.engine.max_running_requests == 16 and cfg.job.max_new_tokens == 256
    assert (cfg.job.sampling.temperature, cfg.job.sampling.top_p, cfg.job.sampling.top_k) == \
        (1.0, 1.0, -1)


def test_unknown_engine_is_refused():
    with pytest.raises(SystemExit):
        bench_run.parse_args(["--engine", "vllm"])
