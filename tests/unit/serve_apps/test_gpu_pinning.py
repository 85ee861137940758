"""A cuda engine runs on exactly one GPU: the config requires serve.num_gpus_per_replica 1,
and the replica checks what Ray gave it before it starts the engine."""

import pytest

from contract.config import ConfigError, EngineSections, SGLangEngineConfig
from jobs.config import parse_config
from serve_apps import engine_deployment, gpu_pinning
from serve_apps.gpu_pinning import visible_gpu_problem

CUDA = {"kind": "sglang", "model_path": "Qwen/Qwen3.6-27B"}
JOB = {"input": "p.jsonl", "output": "out", "run_name": "r"}


@pytest.mark.parametrize("gpus", [0, 0.5, 2])
def test_cuda_engine_needs_one_gpu_per_replica_naming_the_key(gpus):
    tree = {"engine": CUDA, "serve": {"num_gpus_per_replica": gpus}}
    with pytest.raises(ValueError, match=rf"serve.num_gpus_per_replica is {gpus:g}: a cuda "
                                         rf"engine runs on exactly 1 GPU"):
        EngineSections.model_validate(tree)
    with pytest.raises(ConfigError, match="serve.num_gpus_per_replica is"):
        parse_config({**tree, "job": JOB})


@pytest.mark.parametrize("engine, gpus", [
    (CUDA, 1), (CUDA, None),  # None: the default, 1 for a cuda engine
    ({**CUDA, "device": "cpu", "max_total_tokens": 4096}, 0),
    ({"kind": "simulator"}, 0), ({"kind": "simulator"}, 0.5),
])
def test_other_pinnings_are_accepted(engine, gpus):
    parse_config({"engine": engine, "serve": {"num_gpus_per_replica": gpus}, "job": JOB})


@pytest.mark.parametrize("ids, visible, problem", [
    ([0], "0", None),
    (["GPU-5d1c"], "GPU-5d1c", None),   # UUID ids, as Ray reports them on some nodes
    ([3], " 3 ", None),
    ([], None, "replica was given 0 GPUs, its cuda engine needs 1"),
    ([], "", "replica was given 0 GPUs"),
    ([0, 1], "0,1", "replica was given 2 GPUs"),
    ([1], None, "CUDA_VISIBLE_DEVICES is not this replica's GPU"),  # engine would see all
    ([1], "0", "CUDA_VISIBLE_DEVICES is not this replica's GPU"),
    ([1], "1,2", "CUDA_VISIBLE_DEVICES is not this replica's GPU"),
])
def test_visible_gpu_problem(ids, visible, problem):
    got = visible_gpu_problem(ids, visible)
    if problem is None:
        assert got is None
    else:
        assert got.startswith(problem) and "\n" not in got
        assert "serve.num_gpus_per_replica" in got or "CUDA_VISIBLE_DEVICES" in got


def test_replica_stops_before_starting_its_engine_on_the_wrong_gpus(monkeypatch):
    import ray
    started = []
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(engine_deployment, "start_engine", lambda *a, **k: started.append(a))
    with pytest.raises(RuntimeError, match="set serve.num_gpus_per_replica: 1"):
        engine_deployment.ProcessBackend(SGLangEngineConfig(**CUDA), "engine[r]")
    assert started == []


def test_cpu_engine_is_not_checked(monkeypatch):
    monkeypatch.setattr(gpu_pinning, "require_own_gpu", lambda: pytest.fail("checked"))
    started = []

    class Proc:
        base_url, pid = "http://127.0.0.1:1", 1

    monkeypatch.setattr(engine_deployment, "start_engine",
                        lambda *a, **k: started.append(a) or Proc())
    engine_deployment.ProcessBackend(
        SGLangEngineConfig(**CUDA, device="cpu", max_total_tokens=4096), "engine[r]")
    assert len(started) == 1
