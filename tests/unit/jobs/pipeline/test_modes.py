"""jobs.pipeline.modes: one strategy per mode, each mode's decisions pinned here: the
columns its rows carry, its request, its data row and failure row, the breaker's flags
verdict, and the session facts (its plan's source, the every_turn refusal, the summary's
word, what follows it)."""

from __future__ import annotations

import json

import pytest

from contract.protocol import GenerateResult
from jobs.config import parse_config
from jobs.io.samples import SEED_FIELD
from jobs.pipeline.modes import (CONTINUE_INPUTS, GENERATE_INPUTS, HELD_PREFIX, STRATEGIES,
                                 Mode, strategy)
from jobs.pipeline.settings import RunMode, StageSettings
from tests.support.run_rows import make_row

TREE = {"engine": {"kind": "simulator", "model_path": "sim-m"},
        "job": {"input": "p.jsonl", "output": "/tmp/o", "run_name": "r", "max_new_tokens": 64}}
PROMPTS = (Mode.FRESH, Mode.RETRY_FAILED, Mode.PILOT)     # from the input, as version 0
HELD = (Mode.CONTINUE, Mode.REGENERATE, Mode.NEXT_TURN)  # data/ rows, as their next version


def _stage(mode: Mode, continue_to=None) -> StageSettings:
    return StageSettings.of(parse_config(TREE), RunMode(mode, continue_to=continue_to))


def _row(**over) -> dict:
    return make_row("k", version=2, messages=json.dumps([{"role": "user", "content": "hi"}]),
                    prompt_token_ids=[1, 2], output_token_ids=[3, 4, 5], completion_tokens=3,
                    budget_history=[3], continuations=2, **over)


def _result() -> GenerateResult:
    return GenerateResult(key="k", answer="a", finish_reason="stop", output_token_ids=[3, 4, 5, 6],
                          prompt_token_ids=[1, 2], completion_tokens=1, max_new_tokens=9,
                          effective_max_new_tokens=9, latency_s=1.0, replica="r0")


def test_every_mode_has_one_strategy_and_a_mode_is_found_by_its_name():
    assert set(STRATEGIES) == set(Mode)
    assert all(strategy(m).mode is m for m in Mode)
    assert strategy("continue") is strategy(Mode.CONTINUE)
    assert RunMode("next-turn").kind is Mode.NEXT_TURN  # a plain string names its mode
    assert RunMode.of_flags(continue_truncated=True, max_total_tokens=9).strategy.mode \
        is Mode.CONTINUE
    assert _stage(Mode.REGENERATE).strategy is strategy(Mode.REGENERATE)


def test_the_columns_each_mode_reads():
    for m in PROMPTS:
        assert strategy(m).inputs.columns == GENERATE_INPUTS.columns
    for m in (Mode.REGENERATE, Mode.NEXT_TURN):
        assert set(strategy(m).inputs.columns) == set(GENERATE_INPUTS.columns) | {"version"}
    assert set(strategy(Mode.CONTINUE).inputs.columns) == (set(GENERATE_INPUTS.columns)
                                                          | set(CONTINUE_INPUTS))


def test_only_rows_chosen_by_their_output_skip_the_flags_verdict():
    assert {m for m in Mode if not strategy(m).judges_flags} == {Mode.CONTINUE,
                                                                  Mode.REGENERATE}


def test_a_prompt_request_sends_messages_and_a_continue_request_sends_ids():
    row = _row(seed=7)
    for m in PROMPTS + (Mode.REGENERATE, Mode.NEXT_TURN):
        request = strategy(m).request(row, _stage(m), "label")
        assert (request.messages, request.input_ids, request.max_new_tokens) == (
            [{"role": "user", "content": "hi"}], None, 64)
        assert request.category == "label" and request.sampling[SEED_FIELD] == 7
    request = strategy(Mode.CONTINUE).request(row, _stage(Mode.CONTINUE, 100), "label")
    assert (request.messages, request.input_ids, request.prompt_len,
            request.max_new_tokens) == (None, [1, 2, 3, 4, 5], 2, 97)


def test_the_version_each_mode_writes():
    row, result = _row(), _result()
    for m in PROMPTS:
        assert strategy(m).data_row(row, result, _stage(m), 1)["version"] == 0
    for m in (Mode.REGENERATE, Mode.NEXT_TURN):
        assert strategy(m).data_row(row, result, _stage(m), 1)["version"] == 3
    out = strategy(Mode.CONTINUE).data_row(row, result, _stage(Mode.CONTINUE, 100), 1)
    assert (out["version"], out["completion_tokens"], out["budget_history"]) == (3, 4,
                                                                                 [3, 100])


@pytest.mark.parametrize("retryable", [True, False])
def test_what_a_failed_row_becomes(retryable):
    row = _row()
    for m in PROMPTS + (Mode.REGENERATE,):
        out = strategy(m).failed(row, "bad_request", "no", 3, _stage(m), "r0", retryable)
        assert (out["_kind"], out["error_class"]) == ("failures", "bad_request")
    out = strategy(Mode.CONTINUE).failed(row, "bad_request", "no", 3,
                                         _stage(Mode.CONTINUE, 100), "r0", retryable)
    assert (out["_kind"], out["error_class"]) == ("failures", HELD_PREFIX + "bad_request")
    out = strategy(Mode.NEXT_TURN).failed(row, "bad_request", "no", 3,
                                          _stage(Mode.NEXT_TURN), "r0", retryable)
    if retryable:  # out of attempts: the conversation stays open for the next round
        assert (out["_kind"], out["error_class"]) == ("failures",
                                                      HELD_PREFIX + "bad_request")
    else:  # the conversation ends with the turns it has, as the row's next version
        assert (out["_kind"], out["version"], out["turn_stop"]) == ("data", 3,
                                                                    "error:bad_request")


def test_what_each_mode_tells_the_session():
    from jobs.runs.plans import PLANS
    assert {m: strategy(m).source for m in Mode} == {
        Mode.FRESH: "input", Mode.RETRY_FAILED: "input", Mode.PILOT: "input",
        Mode.CONTINUE: "truncated", Mode.REGENERATE: "condemned",
        Mode.NEXT_TURN: "open_turns"}
    assert {strategy(m).source for m in Mode} == set(PLANS)
    assert {m for m in Mode if strategy(m).every_turn_refusal} == {Mode.CONTINUE,
                                                                    Mode.REGENERATE}
    assert {m: strategy(m).versions_as for m in HELD} == {
        Mode.CONTINUE: "continued", Mode.REGENERATE: "regenerated",
        Mode.NEXT_TURN: "continued"}
    assert {m for m in Mode if not strategy(m).then_rounds} == {Mode.CONTINUE,
                                                                 Mode.REGENERATE}
    assert {m for m in Mode if strategy(m).says_regenerated} == {Mode.REGENERATE}
