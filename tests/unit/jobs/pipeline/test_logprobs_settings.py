"""job.logprobs: refused naming the key when its top_k is not one raygen stores, part of
settings_hash only when set (the hashes below are what runs made before it carry, so a
live run resumes after the upgrade), sent on every mode's request only when set, and a
continued row's lists the earlier version's with the new tokens' appended."""

from __future__ import annotations

import pytest

from contract.config import ConfigError
from contract.protocol import GenerateResult
from jobs.io.schema import DATA, LOGPROB_COLUMNS
from jobs.pipeline.modes import strategy
from jobs.pipeline.rows import continued_row, data_row, to_table
from jobs.pipeline.settings import RunMode, StageSettings
from jobs.config import parse_config
from tests.support.run_rows import make_row

JOB = {"input": "p.jsonl", "output": "/tmp/o", "run_name": "r", "max_new_tokens": 4096}
SGLANG = {"kind": "sglang", "model_path": "Qwen/Qwen3-8B", "context_length": 16384}
SIM = {"kind": "simulator", "model_path": "sim-m", "context_length": 16384}
CONTINUE = RunMode.of_flags(continue_truncated=True, max_total_tokens=8192)


def _stage(engine: dict = SIM, mode: RunMode = RunMode(), **job) -> StageSettings:
    return StageSettings.of(parse_config({"engine": engine, "job": {**JOB, **job}}), mode)


@pytest.mark.parametrize("value, fragment", [
    (-1, "greater than or equal to 0"), (21, "less than or equal to 20"),
    (2.5, "valid integer"), ("5", "valid integer"), (True, "valid integer"),
])
def test_a_top_k_raygen_does_not_store_is_refused_naming_the_key(value, fragment):
    with pytest.raises(ConfigError, match=f"job.logprobs.top_k.*{fragment}"):
        _stage(logprobs={"top_k": value})


def test_an_unknown_logprobs_key_is_refused_naming_it():
    with pytest.raises(ConfigError, match="job.logprobs.top_n"):
        _stage(logprobs={"top_n": 5})


# (settings_hash, legacy_settings_hash) of these configs before job.logprobs existed
# (tests/unit/jobs/pipeline/test_thinking_budget_settings.py holds the same).
@pytest.mark.parametrize("engine, hashes", [
    (SGLANG, ("0f010da6eccc24ae", "a550b72a51d3a6b4")),
    (SIM, ("b5d40cf1a58cfc37", "0a55c25aefc8ebe6")),
])
def test_off_keeps_the_hashes_of_existing_runs_and_on_changes_them(engine, hashes):
    off = _stage(engine)
    assert (off.settings_hash, off.legacy_settings_hash) == hashes
    assert _stage(engine, logprobs=None).settings_hash == hashes[0]
    assert off.logprobs is None
    on = {top: _stage(engine, logprobs={"top_k": top}) for top in (0, 5, 20)}
    assert len({s.settings_hash for s in on.values()} | {hashes[0]}) == 4  # each its own
    assert on[5].logprobs == 5 and on[0].logprobs == 0
    assert _stage(engine, logprobs={}).settings_hash == on[0].settings_hash  # top_k 0
    # the sampling recorded per row is unchanged: logprobs are not a sampling param
    assert on[5].sampling_json == off.sampling_json


def test_every_mode_s_request_carries_the_top_k_only_when_set():
    row = make_row("k", messages='[{"role": "user", "content": "hi"}]', completion_tokens=2,
                   max_new_tokens=2)
    for mode in (RunMode(), CONTINUE):
        for job, want in (({}, None), ({"logprobs": {"top_k": 3}}, 3)):
            stage = _stage(mode=mode, **job)
            assert strategy(stage.mode).request(row, stage, "c").logprobs == want


def _result(ids, logprobs=None, tops=None) -> GenerateResult:
    return GenerateResult(
        key="k", finish_reason="length", completion_tokens=len(ids), output_token_ids=ids,
        prompt_token_ids=[9], max_new_tokens=len(ids), effective_max_new_tokens=len(ids),
        reasoning_tokens=len(ids), finished_thinking=False, output_logprobs=logprobs,
        output_top_logprob_ids=None if tops is None else [[t] for t in tops],
        output_top_logprobs=None if tops is None else [[-0.5] for _ in tops])


ROW = {"key": "k", "id": "k", "category": "c", "messages": "[]", "tools": None}


def test_a_continuation_appends_its_tokens_logprobs_to_the_row_s():
    first = data_row(ROW, _result([1, 2], [-0.1, -0.2], [1, 3]), _stage(logprobs={"top_k": 1}), 1)
    assert first["output_logprobs"] == [-0.1, -0.2]
    # the continuation's result: the whole output's ids, its own tokens' logprobs
    cont = continued_row(first, _result([1, 2, 5], [-0.3], [6]),
                         _stage(mode=CONTINUE, logprobs={"top_k": 1}), 1)
    assert cont["output_logprobs"] == [-0.1, -0.2, -0.3]
    assert cont["output_top_logprob_ids"] == [[1], [3], [6]]
    assert cont["output_top_logprobs"] == [[-0.5]] * 3
    table = to_table([cont])  # the sink's table: float32 lists, one per token
    assert table.schema.field("output_logprobs").type == DATA.field("output_logprobs").type
    assert table.column("output_top_logprob_ids").to_pylist() == [[[1], [3], [6]]]


def test_off_the_columns_stay_null_through_a_continuation():
    first = data_row(ROW, _result([1, 2]), _stage(), 1)
    cont = continued_row(first, _result([1, 2, 5]), _stage(mode=CONTINUE), 1)
    assert all(first[c] is None and cont[c] is None for c in LOGPROB_COLUMNS)


def test_a_continuation_that_breaks_one_entry_per_token_names_the_row():
    first = data_row(ROW, _result([1, 2], [-0.1, -0.2]), _stage(logprobs={}), 1)
    stage = _stage(mode=CONTINUE, logprobs={})
    with pytest.raises(ValueError, match="row 'k': 4 output_logprobs .* for 3 output tokens"):
        continued_row(first, _result([1, 2, 5], [-0.3, -0.4]), stage, 1)
    with pytest.raises(ValueError, match="row 'k': output_logprobs is held .* not sent"):
        continued_row(first, _result([1, 2, 5]), stage, 1)
