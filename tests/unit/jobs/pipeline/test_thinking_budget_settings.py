"""job.sampling.max_thinking_tokens: refused (naming the field) on an engine that cannot
honour it, part of settings_hash only when set (the hashes below are what runs made
before the field existed carry), recorded per row."""

from __future__ import annotations

import json

import pytest

from contract.config import ConfigError
from contract.protocol import GenerateResult
from jobs.config import parse_config
from jobs.pipeline.rows import continued_row, data_row
from jobs.pipeline.settings import RunMode, StageSettings

JOB = {"input": "p.jsonl", "output": "/tmp/o", "run_name": "r", "max_new_tokens": 4096}
SGLANG = {"kind": "sglang", "model_path": "Qwen/Qwen3-8B", "context_length": 16384}
STRICT = {**SGLANG, "extra_args": {"enable-strict-thinking": True}}
SIM = {"kind": "simulator", "model_path": "sim-m", "context_length": 16384}
SIM_STRICT = {**SIM, "simulator": {"enable_strict_thinking": True}}


def _stage(engine: dict, **sampling) -> StageSettings:
    return StageSettings.of(parse_config({"engine": engine, "job": {**JOB, "sampling": sampling}}))


# (settings_hash, legacy_settings_hash) of these configs as raygen computed them before
# max_thinking_tokens existed: an unset budget must leave every existing run's hash alone.
@pytest.mark.parametrize("engine, hashes", [
    (SGLANG, ("0f010da6eccc24ae", "a550b72a51d3a6b4")),
    (SIM, ("b5d40cf1a58cfc37", "0a55c25aefc8ebe6")),
])
def test_an_unset_budget_keeps_the_hashes_of_existing_runs(engine, hashes):
    stage = _stage(engine)
    assert (stage.settings_hash, stage.legacy_settings_hash) == hashes
    assert "max_thinking_tokens" not in json.loads(stage.sampling_json)
    assert stage.max_thinking_tokens is None


def test_a_set_budget_is_in_the_hash_and_each_budget_has_its_own():
    unset, b128, b256 = (_stage(STRICT), _stage(STRICT, max_thinking_tokens=128),
                         _stage(STRICT, max_thinking_tokens=256))
    assert len({unset.settings_hash, b128.settings_hash, b256.settings_hash}) == 3
    assert json.loads(b128.sampling_json)["max_thinking_tokens"] == 128
    assert b128.max_thinking_tokens == 128
    # strict thinking alone changes outputs too (SGLang masks EOS while thinking)
    assert _stage(SGLANG).settings_hash != unset.settings_hash


@pytest.mark.parametrize("engine, expect", [
    (SGLANG, "job.sampling.max_thinking_tokens: SGLang 0.5.23 refuses max_thinking_tokens"
             ".*set engine.extra_args enable-strict-thinking: true"),
    ({**STRICT, "reasoning_parser": None},
     "job.sampling.max_thinking_tokens: engine.reasoning_parser is not set"),
    ({**SGLANG, "extra_args": {"enable-strict-thinking": False}}, "enable-strict-thinking: true"),
    ({**SGLANG, "extra_args": {"--enable-strict-thinking": True, "grammar_backend": "none"}},
     "job.sampling.max_thinking_tokens: engine.extra_args grammar-backend: none"),
    (SIM, "job.sampling.max_thinking_tokens: the simulator honours it only with "
          "engine.simulator.enable_strict_thinking: true"),
])
def test_an_engine_that_cannot_honour_the_budget_is_refused_naming_it(engine, expect):
    with pytest.raises(ConfigError, match=expect):
        _stage(engine, max_thinking_tokens=64)


@pytest.mark.parametrize("engine", [STRICT, SIM_STRICT,
                                    {**SGLANG, "extra_args": {"enable_strict_thinking": True}}])
def test_an_engine_that_can_takes_it(engine):
    assert _stage(engine, max_thinking_tokens=0).max_thinking_tokens == 0


def test_a_negative_budget_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="job.sampling.max_thinking_tokens"):
        _stage(STRICT, max_thinking_tokens=-1)


def _result(**kw) -> GenerateResult:
    return GenerateResult(key="k", finish_reason="length", completion_tokens=4,
                          output_token_ids=[1, 2, 3, 4], prompt_token_ids=[9],
                          max_new_tokens=4, effective_max_new_tokens=4, reasoning_tokens=4,
                          finished_thinking=False, **kw)


def test_every_version_of_a_row_records_the_budget_it_ran_under():
    stage = _stage(SIM_STRICT, max_thinking_tokens=64)
    row = {"key": "k", "id": "k", "category": "c", "messages": "[]", "tools": None}
    first = data_row(row, _result(), stage, attempts=1)
    assert first["max_thinking_tokens"] == 64
    cont = StageSettings.of(parse_config({"engine": SIM_STRICT, "job": {
        **JOB, "sampling": {"max_thinking_tokens": 64}}}), RunMode.of_flags(
        continue_truncated=True, max_total_tokens=8192))
    assert continued_row(first, _result(), cont, attempts=1)["max_thinking_tokens"] == 64
    assert data_row(row, _result(), _stage(SIM), attempts=1)["max_thinking_tokens"] is None
