"""job.sampling.max_thinking_tokens through SGLang's real engine (the pool runs with
--enable-strict-thinking): what SGLang does at the budget, written row for row.

The scripted model thinks ``a..z`` (26 tokens); under a budget of 5 SGLang's strict
thinking grammar lets it think ``abcde``, then allows only ``</think>``, and the model
answers ``ABCDEFGHIJ`` as always. Continuation keeps that token for token: a row cut
while thinking is sent the budget left, a row cut in its answer no budget and
``require_reasoning`` false (else SGLang counts its answer as thinking and masks its EOS:
the row would run to its cap).

Thinking off (job.sampling.thinking false; here the budgeted rows' session is a mix with
thinking-off rows): the prompt SGLang gets ends in the empty think block (the model's own
template renders the same text with enable_thinking=False), SGLang takes the request (``thinking`` is never a
sampling param: 0.5.23 would refuse it with a 400) and counts no reasoning
(require_reasoning false), and the row's whole output is its answer, unflagged.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from jobs.analysis import report
from jobs.pipeline.sampling_mix import draw
from serve_apps.chat_format import model_template_renderer, render_prompt
from serve_apps.engines.sglang_cpu import models
from serve_apps.engines.simulator import tokenizer as tk
from tests.integration.helpers import read, run, store_of, write_prompts
from tests.support import sglang_cpu

pytestmark = [pytest.mark.integration]

ROWS, BUDGET = 8, 5
MIXED_ROWS = 12
CUT_IDS = ([models.byte_id(c) for c in sglang_cpu.REASONING[:BUDGET]] + [tk.THINK_END_ID]
           + [models.byte_id(c) for c in sglang_cpu.ANSWER] + [tk.EOS_ID])


def _job(max_new_tokens: int) -> dict:
    return {"max_new_tokens": max_new_tokens, "rows_per_call": 2,
            "sampling": {"temperature": 0.0, "max_thinking_tokens": BUDGET}}


def _latest(df):
    return df.sort_values("version").groupby("key").tail(1)


@pytest.mark.slow  # 16-41 s of call measured on a loaded machine (22 s with 8 rows before)
def test_sglang_ends_the_thinking_at_the_budget_and_a_thinking_off_row_never_thinks(
        real_config, sglang_pool, tmp_path):
    """One session of a mix: rows under the budget, and rows with thinking off (each
    row's setting its draw; 12 fair draws are all alike 1 in 2,048)."""
    mix = [{"name": "budget", "temperature": 0.0, "max_thinking_tokens": BUDGET},
           {"name": "direct", "temperature": 0.0, "thinking": False}]
    tree = real_config(write_prompts(tmp_path / "p.jsonl", MIXED_ROWS),
                       job=dict(_job(64), sampling=mix))
    assert run(tree).status == "succeeded"
    df = read(tree, "data")
    salt = store_of(tree).key_salt
    assert len(df) == MIXED_ROWS and list(df.setting) == [
        ["budget", "direct"][draw([1, 1], salt, k, None)] for k in df.key]
    assert set(df.setting) == {"budget", "direct"}
    model_template = model_template_renderer(sglang_pool.model)
    for row in df.itertuples():
        assert row.finish_reason == "stop" and list(row.integrity_flags) == [], row.key
        if row.setting == "direct":  # SGLang took it: a 'thinking' param would be a 400
            messages = json.loads(row.messages)
            prompt = render_prompt(messages, thinking=False)
            assert prompt == model_template(messages, thinking=False)  # chat_template: model
            assert list(row.prompt_token_ids) == tk.encode(prompt)
            assert list(row.output_token_ids) == sglang_cpu.OUTPUT_IDS, row.key
            assert (row.reasoning, row.answer) == ("", sglang_cpu.TEXT)  # all the answer
            assert (row.reasoning_tokens, row.finished_thinking) == (0, True)  # SGLang's 0
            assert pd.isna(row.max_thinking_tokens)  # none sent
            continue
        assert list(row.output_token_ids) == CUT_IDS, row.key
        assert (row.reasoning, row.answer) == (sglang_cpu.REASONING[:BUDGET], sglang_cpu.ANSWER)
        assert (row.finish_reason, row.finished_thinking) == ("stop", True)
        assert row.reasoning_tokens == BUDGET + 1      # SGLang's count, </think> included
        assert row.max_thinking_tokens == BUDGET
    budgeted = int((df.setting == "budget").sum())
    entries = {e["max_thinking_tokens"]: e for e in
               report.build_report(store_of(tree))["thinking_budgets"]}
    assert entries[BUDGET]["thinking_ended_at_budget"] == budgeted
    assert entries[BUDGET]["rows"] == budgeted and entries[None]["rows"] == MIXED_ROWS - budgeted


@pytest.mark.parametrize("cut_at, thinking", [(3, True), (8, False)],
                         ids=["cut-while-thinking", "cut-in-the-answer"])
def test_a_continued_row_equals_the_one_shot_row_under_the_budget(real_config, tmp_path,
                                                                   cut_at, thinking):
    tree = real_config(write_prompts(tmp_path / "p.jsonl", ROWS), job=_job(cut_at))
    assert run(tree).progress["truncated"] == ROWS
    before = read(tree, "data")
    assert all(list(ids) == CUT_IDS[:cut_at] for ids in before.output_token_ids)
    assert set(before.finished_thinking) == {not thinking}
    assert run(tree, continue_truncated=True, max_total_tokens=64).status == "succeeded"
    after = _latest(read(tree, "data"))
    assert len(after) == ROWS
    for row in after.itertuples():
        assert list(row.output_token_ids) == CUT_IDS, row.key
        assert (row.finish_reason, row.completion_tokens) == ("stop", len(CUT_IDS))
        assert row.reasoning_tokens == BUDGET + 1
        assert row.max_thinking_tokens == BUDGET

