"""The simulator's thinking budget (max_thinking_tokens), as SGLang 0.5.23 enforces it
under --enable-strict-thinking: the think end forced after the budget, the answer's
length kept, continuation still equal to one long run, and SGLang's refusals."""

from __future__ import annotations

import pytest

from serve_apps.engines.simulator import model
from serve_apps.engines.simulator import tokenizer as tk
from serve_apps.engines.simulator.protocol import ContractError, parse_generate
from tests.support import sglang_cpu

PARAMS = model.LengthParams(median_tokens=30.0, sigma=0.645, accept_length=0.0)
# A chat prompt (ends in "<think>\n") whose natural thinking is 10 words + </think>.
PROMPT = sglang_cpu.chat_ids("what do the two engines say")


def _answer_len(ids: list[int]) -> int:
    return len(ids) - ids.index(tk.THINK_END_ID)


def test_the_budget_forces_the_think_end_and_keeps_the_answer_length():
    free = model.generate(PROMPT, PARAMS, 200)
    assert free.reasoning_tokens == 11  # what the budget below cuts
    cut = model.generate(PROMPT, PARAMS, 200, max_thinking_tokens=3)
    assert cut.output_ids[3] == tk.THINK_END_ID and tk.THINK_END_ID not in cut.output_ids[:3]
    assert cut.output_ids[:3] == free.output_ids[:3]        # the same thinking, cut
    assert cut.reasoning_tokens == 4                         # SGLang counts the </think>
    assert _answer_len(cut.output_ids) == _answer_len(free.output_ids)
    assert cut.finish_reason == free.finish_reason == {"type": "stop", "matched": tk.EOS_ID}


@pytest.mark.parametrize("budget", [10, 11, 500])
def test_a_budget_the_thinking_fits_in_changes_nothing(budget):
    free = model.generate(PROMPT, PARAMS, 200)
    assert model.generate(PROMPT, PARAMS, 200, max_thinking_tokens=budget) == free


def test_budget_zero_closes_the_thinking_at_once():
    cut = model.generate(PROMPT, PARAMS, 200, max_thinking_tokens=0)
    assert cut.output_ids[0] == tk.THINK_END_ID and cut.reasoning_tokens == 1


def test_continuing_a_budget_cut_run_is_the_single_run_token_for_token():
    whole = model.generate(PROMPT, PARAMS, 200, max_thinking_tokens=3).output_ids
    # Cut while thinking (2 of 3 tokens): the replica sends the budget left, 1.
    rest = model.generate(PROMPT + whole[:2], PARAMS, 200, max_thinking_tokens=1).output_ids
    assert whole[:2] + rest == whole
    # Cut in the answer: past </think> no budget is sent.
    rest = model.generate(PROMPT + whole[:6], PARAMS, 200).output_ids
    assert whole[:6] + rest == whole


def test_max_thinking_tokens_is_a_u64_request_field_as_in_sglangs_contract():
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8}}
    assert parse_generate({**body, "max_thinking_tokens": 5}).max_thinking_tokens == 5
    assert parse_generate(body).max_thinking_tokens is None
    for value, message in [(-1, "invalid value: integer `-1`, expected u64"),
                           ("5", 'invalid type: string "5", expected u64'),
                           (True, "invalid type: boolean `true`, expected u64")]:
        with pytest.raises(ContractError, match=message):
            parse_generate({**body, "max_thinking_tokens": value})
    with pytest.raises(ContractError, match="unknown field `max_thinking_tokens`"):
        parse_generate({**body, "sampling_params": {"max_thinking_tokens": 5}})
