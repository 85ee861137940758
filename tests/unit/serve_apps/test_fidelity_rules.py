"""raygen's own rules that issue #12 found wrong against SGLang 0.5.23 (no SGLang import
needed here; the oracle and differential tiers check the same rules against SGLang's code).

- a real model path under the default simulator kind is refused; chat_template defaults
  to the model's own template for SGLang;
- the reasoning column never starts with a literal <think>;
- reasoning_tokens: SGLang's count when present, else counted from the output ids;
- --check-context counts prompts against the room SGLang really gives;
- the replica reports the engine's effective running cap.
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from jobs.runs.context_check import summarize
from serve_apps.chat_format import split_reasoning
from contract.config import (SGLangEngineConfig, SimulatorEngineConfig, SpeculativeConfig,
                             parse_engine_config)
from serve_apps.engine_client import EngineOutput, effective_running_cap
from serve_apps.engines import launch_command
from serve_apps.engine_resolution import mismatches
from contract.simulator_settings import SimulatorSettings
from serve_apps.generation import Generator


def test_simulator_kind_refuses_a_real_model_path():
    with pytest.raises(ValidationError, match=r"engine.kind is simulator but engine.model_path "
                                              r"'Qwen/Qwen3.6-27B' is not a simulator model"):
        parse_engine_config({"kind": "simulator", "model_path": "Qwen/Qwen3.6-27B"})
    assert parse_engine_config({"kind": "simulator",
                                "model_path": "sim-qwen3"}).kind == "simulator"
    assert parse_engine_config({"kind": "sglang", "model_path": "Qwen/Qwen3.6-27B"}).kind == "sglang"


def test_chat_template_defaults_to_the_model_for_sglang_only():
    assert SGLangEngineConfig(kind="sglang", model_path="Qwen/Qwen3.6-27B").chat_template == "model"
    assert SimulatorEngineConfig(kind="simulator").chat_template == "builtin"
    assert SGLangEngineConfig(kind="sglang", model_path="m", chat_template="builtin").chat_template == "builtin"


@pytest.mark.parametrize("text, reasoning, answer, done", [
    ("\nthink hard</think>\n\nThe answer.", "think hard", "The answer.", True),
    ("<think>\nthink hard</think>\n\nThe answer.", "think hard", "The answer.", True),
    ("<think>\nstill thinking", "still thinking", "", False),
])
def test_reasoning_never_starts_with_the_think_tag(text, reasoning, answer, done):
    assert split_reasoning(text) == (reasoning, answer, done)


def _out(output_ids, reasoning_tokens=None) -> EngineOutput:
    return EngineOutput(text="", output_ids=output_ids, finish_reason="stop", matched_stop="2",
                        finish_length=None, prompt_tokens=3, completion_tokens=len(output_ids),
                        cached_tokens=0, reasoning_tokens=reasoning_tokens,
                        spec_verify_ct=None, e2e_latency_s=0.1)


def _generator(**kw) -> Generator:
    return Generator(client=None, context_length=16384, think_end="</think>", replica_id="r",
                     engine_alive=lambda: True, **kw)


def test_reasoning_tokens_fall_back_to_the_output_ids_when_the_engine_does_not_count():
    gen = _generator()
    gen._think_end_ids = [4]  # what /tokenize gives for "</think>" in the simulator's layout
    out = _out([263, 264, 265, 4, 10, 2])
    assert gen._result("k", [1], out.output_ids, out, 100, 100, 0.1, "a b c</think>\nx")["reasoning_tokens"] == 4
    # SGLang's own count wins when the engine reports it.
    counted = _out([263, 4, 2], reasoning_tokens=2)
    assert gen._result("k", [1], counted.output_ids, counted, 100, 100, 0.1, "a</think>x")["reasoning_tokens"] == 2
    # No think end yet: all of it is reasoning.
    cut = _out([263, 264, 265])
    assert gen._result("k", [1], cut.output_ids, cut, 100, 100, 0.1, "a b c")["reasoning_tokens"] == 3


def test_check_context_counts_against_sglangs_room():
    # context 1000, budget 100: SGLang gives 1000 - n - max(reserve, 2), and only n < 994.
    tokens = np.array([898, 899, 900, 993, 994])
    plain = summarize(tokens, 1000, 100)
    assert plain["short_of_full_budget"] == 4      # 899 + 100 > 1000 - 2
    assert plain["prompt_alone_too_long"] == 1     # 994 >= 1000 - 6
    assert plain["context_needed_for_all"] == 994 + 100 + 2
    spec = summarize(tokens, 1000, 100, reserved=20)
    assert spec["short_of_full_budget"] == 5 and spec["reserved_tokens"] == 20
    assert spec["prompt_alone_too_long"] == 2      # input + 20 >= 1000 - 1 ... no room at 993, 994
    assert spec["context_needed_for_all"] == 994 + 100 + 20


def test_simulator_gets_sglangs_reserve_from_the_speculative_config():
    cfg = SimulatorEngineConfig(kind="simulator", context_length=4096,
                                speculative=SpeculativeConfig(algorithm="NEXTN", num_steps=3,
                                                              eagle_topk=1, num_draft_tokens=4))
    cmd = launch_command(cfg, "127.0.0.1", 30000)
    settings = SimulatorSettings.from_cli_args(cmd[cmd.index("--port") + 2:])
    assert settings.speculative_reserved_tokens == cfg.reserved_tokens == 4
    assert settings.speculative_num_draft_tokens == 4


@pytest.mark.parametrize("spec, resolved", [
    (dict(algorithm="NEXTN", num_steps=3, eagle_topk=1, num_draft_tokens=8), ("EAGLE", 3, 1, 4)),
    (dict(algorithm="EAGLE3", num_steps=5, eagle_topk=4, num_draft_tokens=8, draft_model_path="d"),
     ("EAGLE3", 5, 4, 8)),
    (dict(algorithm="DFLASH", draft_model_path="d"), ("DFLASH", 1, 1, 16)),
])
def test_simulator_runs_the_speculation_sglang_resolves(spec, resolved):
    # ... and reports it in /server_info as SGLang does, so the replica's start check
    # (engine_resolution.py) finds the simulated engine as planned.
    cfg = SimulatorEngineConfig(kind="simulator", context_length=4096,
                                speculative=SpeculativeConfig(**spec))
    cmd = launch_command(cfg, "127.0.0.1", 30000)
    s = SimulatorSettings.from_cli_args(cmd[cmd.index("--port") + 2:])
    assert (s.speculative_algorithm, s.speculative_num_steps, s.speculative_eagle_topk,
            s.speculative_num_draft_tokens) == resolved
    info = {"context_length": s.context_length, "max_running_requests": s.max_running_requests,
            **{f"speculative_{k}": getattr(s, f"speculative_{k}")
               for k in ("algorithm", "num_steps", "eagle_topk", "num_draft_tokens")}}
    assert mismatches(cfg, info) == []


def test_effective_running_cap_prefers_the_schedulers_own_figure():
    info = {"max_running_requests": 64,
            "internal_states": [{"effective_max_running_requests_per_dp": 48}]}
    assert effective_running_cap(info) == 48
    assert effective_running_cap({"max_running_requests": 64}) == 64
    assert effective_running_cap({"internal_states": [{}]}) is None
