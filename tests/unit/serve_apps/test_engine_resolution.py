"""serve_apps/engine_resolution.py: the engine's /server_info against the job's plan.
(SGLang's own resolution of every shipped config agrees: tests/contract/sglang/
test_sglang_resolution.py; the real CPU engine's /server_info: tests/integration/sglang/
test_engine.py.)"""

from __future__ import annotations

import pytest

from contract.config import SGLangEngineConfig, SpeculativeConfig
from serve_apps.engine_resolution import EngineResolvedOtherwise, check, mismatches


def _cfg(**spec) -> SGLangEngineConfig:
    return SGLangEngineConfig(kind="sglang", model_path="m", context_length=8192,
                              max_running_requests=32,
                              speculative=SpeculativeConfig(**spec) if spec else None)


def _info(**fields) -> dict:
    """/server_info as SGLang 0.5.23 answers it: resolved server args at the top, the
    scheduler's state per DP rank in internal_states."""
    info = {"context_length": 8192, "max_running_requests": 32, "speculative_algorithm": None,
            "speculative_num_steps": None, "speculative_eagle_topk": None,
            "speculative_num_draft_tokens": None,
            "internal_states": [{"effective_max_running_requests_per_dp": 32}]}
    cap = fields.pop("effective_cap", None)
    if cap is not None:
        info["internal_states"] = [{"effective_max_running_requests_per_dp": cap}]
    info.update(fields)
    return info


def test_an_engine_that_resolved_the_plan_passes():
    assert mismatches(_cfg(), _info()) == []
    # NEXTN 3/1/4 runs as EAGLE with 3 steps, topk 1 and 4 draft tokens
    assert mismatches(_cfg(algorithm="NEXTN"), _info(
        speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
        speculative_num_draft_tokens=4)) == []
    check(_cfg(), _info())  # no raise


def test_fewer_running_requests_than_planned_names_the_setting_and_the_figure():
    (line,) = mismatches(_cfg(), _info(effective_cap=20))
    assert line.startswith("engine.max_running_requests: the job plans 32")
    assert "at most 20" in line and "set engine.max_running_requests to 20" in line
    assert mismatches(_cfg(), _info(effective_cap=40)) == []  # more room is no harm


def test_another_context_length_names_the_setting():
    (line,) = mismatches(_cfg(), _info(context_length=4096))
    assert line == ("engine.context_length: the job plans prompts and budgets for 8192 "
                    "tokens, the engine resolved 4096")


def test_rewritten_draft_tokens_name_the_speculative_setting():
    # raygen plans 4 (topk 1: steps + 1); an engine running 8 reserves more context
    (line,) = mismatches(_cfg(algorithm="NEXTN", num_draft_tokens=8), _info(
        speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
        speculative_num_draft_tokens=8))
    assert line.startswith("engine.speculative.num_draft_tokens: the job plans 4")
    assert line.endswith("the engine runs 8")


def test_speculation_off_on_the_engine_but_planned_is_a_mismatch():
    found = mismatches(_cfg(algorithm="NEXTN"), _info())
    assert found[0] == ("engine.speculative: the job plans EAGLE (as SGLang resolves the "
                        "config), the engine runs None")
    assert mismatches(_cfg(), _info(speculative_algorithm="EAGLE"))  # and the other way


def test_dflash_block_is_the_drafters_and_not_compared():
    cfg = _cfg(algorithm="DFLASH", draft_model_path="d")
    assert mismatches(cfg, _info(speculative_algorithm="DFLASH", speculative_num_steps=1,
                                 speculative_eagle_topk=1, speculative_num_draft_tokens=16)) == []


def test_fields_the_engine_does_not_report_are_not_compared():
    assert mismatches(_cfg(algorithm="NEXTN"), {}) == []
    assert mismatches(_cfg(), {"max_running_requests": 32}) == []  # the flag alone: no cap said


def test_check_raises_one_message_with_every_mismatch():
    with pytest.raises(EngineResolvedOtherwise) as info:
        check(_cfg(), _info(context_length=4096, effective_cap=8))
    text = str(info.value)
    assert "\n" not in text
    assert "engine.context_length" in text and "engine.max_running_requests" in text
