"""The GPU smoke's tuning sweep (cluster/gpu_smoke.tune_step): run on the user's config
with the smoke's engine and prompts, printed, and never the smoke's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cluster import gpu_smoke
from jobs.tune import command

REPO = Path(__file__).resolve().parents[3]
B200 = REPO / "jobs" / "configs" / "qwen36-27b-b200.yaml"


def smoke_tree(tmp_path) -> dict:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    return gpu_smoke.smoke_tree(str(B200), str(model), None, prompts, str(tmp_path / "o"), "s")


def test_the_sweep_runs_on_the_users_replicas_with_the_smokes_engine(tmp_path, monkeypatch):
    smoke = smoke_tree(tmp_path)
    seen, said = {}, []

    def fake_tune(cfg, sweep, prompts, say=print):
        seen.update(cfg=cfg, sweep=sweep, prompts=prompts)
        say("a point")
        return {"lines": ["the table", "", "recommended: ..."]}

    monkeypatch.setattr(command, "tune", fake_tune)
    gpu_smoke.tune_step(str(B200), smoke, 15.0, ours=True, say=said.append)
    user = yaml.safe_load(B200.read_text())
    cfg = seen["cfg"]
    assert cfg.engine.model_path == smoke["engine"]["model_path"]  # --model
    assert cfg.serve.autoscaling.min_replicas == user["serve"]["autoscaling"]["min_replicas"]
    assert cfg.job.max_actors == user["job"]["max_actors"]  # what the settings are for
    assert cfg.job.max_new_tokens == user["job"]["max_new_tokens"]
    assert seen["sweep"].point_s == 15.0 and seen["sweep"].caps == (cfg.engine.max_running_requests,)
    assert seen["prompts"] == [{"category": "none", "messages": [{"role": "user", "content": "hi"}],
                                "tools": None}]
    assert said == ["gpu_smoke: a point", "gpu_smoke: the table", "gpu_smoke:",
                    "gpu_smoke: recommended: ..."]


def test_a_failing_sweep_is_printed_and_an_attached_app_or_zero_seconds_skip_it(
        tmp_path, monkeypatch):
    smoke = smoke_tree(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("engine died\nwith a long story")

    monkeypatch.setattr(command, "tune", broken)
    said = []
    gpu_smoke.tune_step(str(B200), smoke, 15.0, ours=True, say=said.append)  # no raise
    assert said == ["gpu_smoke: tune failed (the checks above decide the exit code): "
                    "RuntimeError: engine died with a long story"]
    said.clear()
    gpu_smoke.tune_step(str(B200), smoke, 15.0, ours=False, say=said.append)
    assert "tune skipped: the engine's app was running before the smoke" in said[0]
    said.clear()
    gpu_smoke.tune_step(str(B200), smoke, 0, ours=True, say=said.append)
    assert said == []
