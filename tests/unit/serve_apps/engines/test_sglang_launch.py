"""The SGLang launch: a cpu engine gets SGLang's CPU flags and raygen's shims on its own
path; a GPU (cuda) engine gets neither, ever."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
from pydantic import ValidationError

from contract.config import ServeConfig, SGLangEngineConfig
from contract.outcomes import EngineStartError
from serve_apps.app import deployment_options, with_local_paths
from serve_apps.engines import default_gpus, launch_command, launch_env, sglang_cpu
from serve_apps.engines.sglang import CPU_FLAGS

CPU = dict(kind="sglang", model_path="/models/tiny", device="cpu", max_total_tokens=4096)
GPU = dict(kind="sglang", model_path="Qwen/Qwen3.6-27B")


def test_a_gpu_engine_never_sees_the_cpu_shims_or_flags(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/job/working_dir")
    cfg = SGLangEngineConfig(**GPU)
    assert launch_env(cfg) == {}  # the engine inherits the replica's environment as is
    argv = launch_command(cfg, "127.0.0.1", 31000)
    assert not {f for f in CPU_FLAGS if f.startswith("--")} & set(argv)
    assert "--max-total-tokens" not in argv
    assert str(sglang_cpu.SHIMS) not in " ".join(argv)
    assert default_gpus(cfg) == 1


def test_a_cpu_engine_gets_the_shims_first_and_keeps_the_replicas_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/job/working_dir", "/extra"]))
    cfg = SGLangEngineConfig(**CPU)
    env = launch_env(cfg)
    assert env == {"SGLANG_USE_CPU_ENGINE": "1",
                   "PYTHONPATH": os.pathsep.join([str(sglang_cpu.SHIMS), "/job/working_dir",
                                                  "/extra"]),
                   "OMP_NUM_THREADS": "1"}  # whatever the replica's: spinning threads
    assert (sglang_cpu.SHIMS / "sitecustomize.py").is_file()
    assert (sglang_cpu.SHIMS / "sgl_kernel" / "__init__.py").is_file()
    argv = launch_command(cfg, "127.0.0.1", 31000)
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]  # one venv, as in the image
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--max-total-tokens") + 1] == "4096"
    assert default_gpus(cfg) == 0
    options = deployment_options(cfg, ServeConfig())
    assert options["ray_actor_options"]["num_gpus"] == 0


def test_a_cpu_engine_without_the_shims_is_refused_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(sglang_cpu, "SHIMS", tmp_path / "missing")
    with pytest.raises(EngineStartError, match="no CPU shims"):
        launch_env(SGLangEngineConfig(**CPU))


def test_a_cpu_engine_needs_its_kv_pool_size():
    with pytest.raises(ValidationError, match="device cpu needs max_total_tokens"):
        SGLangEngineConfig(**{**CPU, "max_total_tokens": None})


@pytest.mark.parametrize("spec, named", [
    ({"algorithm": "EAGLE", "num_steps": 1, "eagle_topk": 1, "draft_model_path": "/d"}, "EAGLE"),
    ({"algorithm": "STANDALONE", "num_steps": 3, "draft_model_path": "/d"}, "num_steps 3"),
    ({"algorithm": "STANDALONE", "num_steps": 1, "eagle_topk": 2, "num_draft_tokens": 4,
      "draft_model_path": "/d"}, "eagle_topk 2"),
])
def test_a_cpu_engine_refuses_speculation_its_shims_cannot_run(spec, named):
    with pytest.raises(ValidationError, match=f"device cpu runs speculative decoding as .*{named}"):
        SGLangEngineConfig(**{**CPU, "speculative": spec})
    SGLangEngineConfig(**{**CPU, "speculative": {"algorithm": "STANDALONE", "num_steps": 1,
                                                 "eagle_topk": 1, "draft_model_path": "/d"}})


def test_the_stand_in_kernel_names_the_op_it_lacks(monkeypatch):
    monkeypatch.syspath_prepend(str(sglang_cpu.SHIMS))
    kernel = importlib.import_module("sgl_kernel")
    try:
        op = kernel.fused_add_rmsnorm  # any name imports ...
        with pytest.raises(NotImplementedError, match="sgl_kernel.fused_add_rmsnorm was called"):
            op()                      # ... and fails loudly when called
    finally:
        sys.modules.pop("sgl_kernel", None)


def test_relative_model_paths_that_exist_here_become_absolute(tmp_path, monkeypatch):
    (tmp_path / ".local" / "models" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    cfg = with_local_paths(SGLangEngineConfig(**{**CPU, "model_path": ".local/models/tiny"}))
    assert cfg.model_path == str(tmp_path / ".local" / "models" / "tiny")
    hub = with_local_paths(SGLangEngineConfig(**GPU))
    assert hub.model_path == "Qwen/Qwen3.6-27B"  # a hub id is left alone


def test_engine_output_goes_to_the_replica_log_file_only(tmp_path):
    """In a replica, Serve's "ray.serve" logger has a file handler (the replica's log)
    and a stderr one (which Ray streams to the job driver's console): the engine's
    lines must reach the first only."""
    import logging

    from serve_apps import engine_process
    serve_logger = logging.getLogger("ray.serve")
    file_handler = logging.FileHandler(tmp_path / "replica.log")
    stream_handler = logging.StreamHandler()
    saved = (list(serve_logger.handlers), engine_process.logger.propagate,
             list(engine_process.logger.handlers))
    serve_logger.handlers[:] = [file_handler, stream_handler]
    try:
        engine_process._to_replica_log_file()
        engine_process._to_replica_log_file()  # once per engine start: no duplicates
        assert engine_process.logger.handlers == [file_handler]
        assert engine_process.logger.propagate is False
        engine_process.logger.warning("[engine] The server is fired up")
        file_handler.flush()
        assert "fired up" in (tmp_path / "replica.log").read_text()
    finally:
        serve_logger.handlers[:] = saved[0]
        engine_process.logger.propagate, engine_process.logger.handlers[:] = saved[1], saved[2]
        file_handler.close()


def _model(tmp_path, name: str, model_type) -> str:
    folder = tmp_path / name
    folder.mkdir()
    if model_type is not None:
        (folder / "config.json").write_text(f'{{"model_type": "{model_type}"}}')
    return str(folder)


def test_a_cpu_engine_loads_only_the_registry_modules_of_the_models_it_serves(tmp_path):
    """SGLANG_DISABLED_MODEL_ARCHS: every module of SGLang's model registry but the ones
    named by the served models' model_type (the target's and its draft's); nothing is
    disabled when a type has no module of that name or a config cannot be read."""
    registry = tmp_path / "models"
    registry.mkdir()
    for name in ("__init__", "llama", "qwen2", "qwen3", "qwen3_moe", "grok"):
        (registry / f"{name}.py").write_text("")
    target, draft = _model(tmp_path, "t", "qwen3"), _model(tmp_path, "d", "llama")
    assert sglang_cpu.other_model_archs([target], registry) == "grok,llama,qwen2,qwen3_moe"
    assert sglang_cpu.other_model_archs([target, draft], registry) == "grok,qwen2,qwen3_moe"
    assert sglang_cpu.other_model_archs([_model(tmp_path, "x", "mamba9")], registry) is None
    assert sglang_cpu.other_model_archs([_model(tmp_path, "n", None)], registry) is None
    assert sglang_cpu.other_model_archs(["Qwen/Qwen3-8B"], registry) is None  # a hub name
    assert sglang_cpu.other_model_archs([target], tmp_path / "no-sglang") is None
