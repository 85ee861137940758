"""Engine-side rules: config checks for SGLang's silent caps, and 200 responses that
are not completions (abort, NaN) becoming retryable errors instead of data rows."""

import pytest
from pydantic import ValidationError

from serve_apps.app import build_app_from_env
from contract.config import SGLangEngineConfig, SpeculativeConfig
from serve_apps.engine_client import EngineOutput
from contract.outcomes import EngineAborted
from serve_apps.generation import check_finish


def _out(**kw) -> EngineOutput:
    base = dict(text="x", output_ids=[1], finish_reason="stop", matched_stop="2",
                finish_length=None, prompt_tokens=3, completion_tokens=1, cached_tokens=0,
                reasoning_tokens=None, spec_verify_ct=None, e2e_latency_s=0.1)
    base.update(kw)
    return EngineOutput(**base)


def test_mamba_cache_too_small_for_running_requests_is_refused():
    with pytest.raises(ValidationError, match=r"caps running requests at 16 < max_running"):
        SGLangEngineConfig(kind="sglang", model_path="m", max_mamba_cache_size=80,
                           max_running_requests=40)
    assert SGLangEngineConfig(kind="sglang", model_path="m", max_mamba_cache_size=200,
                              max_running_requests=40).max_mamba_cache_size == 200


def test_eagle_needs_a_draft_model():
    with pytest.raises(ValidationError, match="needs draft_model_path"):
        SpeculativeConfig(algorithm="EAGLE3")
    assert SpeculativeConfig(algorithm="NEXTN").draft_model_path is None


@pytest.mark.parametrize("out", [_out(finish_reason="abort"),
                                 _out(finish_reason="stop", matched_stop="NaN happened")])
def test_abort_and_nan_are_retryable_errors(out):
    with pytest.raises(EngineAborted) as info:
        check_finish(out)
    assert info.value.retryable and info.value.error_class == "engine_abort"


def test_normal_finishes_pass():
    check_finish(_out())
    check_finish(_out(finish_reason="length", matched_stop=None, finish_length=1))


def test_build_app_from_env_needs_a_config(monkeypatch):
    monkeypatch.delenv("RAYGEN_CONFIG", raising=False)
    with pytest.raises(ValueError, match="RAYGEN_CONFIG"):
        build_app_from_env({})


def test_build_app_from_env_builds_the_configured_deployment():
    app = build_app_from_env({"config": "jobs/configs/qwen36-27b-b200.yaml"})
    deployment = app._bound_deployment
    assert deployment.name == "engine"
    assert deployment.ray_actor_options["num_gpus"] == 1


def test_engine_silent_clamp_is_recorded():
    from serve_apps.generation import Generator
    gen = Generator(client=None, context_length=16384, think_end="</think>", replica_id="r",
                    engine_alive=lambda: True)
    out = _out(finish_reason="length", matched_stop=None, finish_length=3000,
               completion_tokens=3000, output_ids=[5] * 3000)
    result = gen._result("k", [1, 2, 3], out.output_ids, out, budget=8192, effective=8192,
                         latency_s=1.0, text="cut")
    assert result.budget_clamped_by == "engine"
    fine_out = _out(finish_reason="length", finish_length=8192)
    fine = gen._result("k", [1, 2, 3], fine_out.output_ids, fine_out, budget=8192,
                       effective=8192, latency_s=1.0, text="cut")
    assert fine.budget_clamped_by == ""
