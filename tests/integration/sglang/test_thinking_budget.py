"""job.sampling.max_thinking_tokens through SGLang's real engine (the pool runs with
--enable-strict-thinking): what SGLang does at the budget, written row for row.

The scripted model thinks ``a..z`` (26 tokens); under a budget of 5 SGLang's strict
thinking grammar lets it think ``abcde``, then allows only ``</think>``, and the model
answers ``ABCDEFGHIJ`` as always. Continuation keeps that token for token: a row cut
while thinking is sent the budget left, a row cut in its answer no budget and
``require_reasoning`` false (else SGLang counts its answer as thinking and masks its EOS:
the row would run to its cap).

Thinking off (job.sampling.thinking false, here in a mix with thinking rows): the prompt
SGLang gets ends in the empty think block (the model's own template renders the same
text with enable_thinking=False), SGLang takes the request (``thinking`` is never a
sampling param: 0.5.23 would refuse it with a 400) and counts no reasoning
(require_reasoning false), and the row's whole output is its answer, unflagged.
"""

from __future__ import annotations

import json

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
CUT_IDS = ([models.byte_id(c) for c in sglang_cpu.REASONING[:BUDGET]] + [tk.THINK_END_ID]
           + [models.byte_id(c) for c in sglang_cpu.ANSWER] + [tk.EOS_ID])


def _job(max_new_tokens: int) -> dict:
    return {"max_new_tokens": max_new_tokens, "rows_per_call": 2,
            "sampling": {"temperature": 0.0, "max_thinking_tokens": BUDGET}}


def _latest(df):
    return df.sort_values("version").groupby("key").tail(1)


def test_sglang_ends_the_thinking_at_the_budget_and_the_row_records_it(real_config, tmp_path):
    tree = real_config(write_prompts(tmp_path / "p.jsonl", ROWS), job=_job(64))
    assert run(tree).status == "succeeded"
    df = read(tree, "data")
    assert len(df) == ROWS
    for row in df.itertuples():
        assert list(row.output_token_ids) == CUT_IDS, row.key
        assert (row.reasoning, row.answer) == (sglang_cpu.REASONING[:BUDGET], sglang_cpu.ANSWER)
        assert (row.finish_reason, row.finished_thinking) == ("stop", True)
        assert row.reasoning_tokens == BUDGET + 1      # SGLang's count, </think> included
        assert row.max_thinking_tokens == BUDGET
    entry, = report.build_report(store_of(tree))["thinking_budgets"]
    assert (entry["max_thinking_tokens"], entry["thinking_ended_at_budget"]) == (BUDGET, ROWS)


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


def test_a_mix_with_thinking_off_through_sglang(real_config, sglang_pool, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 12)
    tree = real_config(rows, job={"rows_per_call": 2, "sampling": [
        {"name": "think", "temperature": 0.0}, {"name": "direct", "temperature": 0.0,
                                                "thinking": False}]})
    assert run(tree).status == "succeeded"
    df = read(tree, "data")
    salt = store_of(tree).key_salt
    assert len(df) == 12 and list(df.setting) == [
        ["think", "direct"][draw([1, 1], salt, k, None)] for k in df.key]
    assert set(df.setting) == {"think", "direct"}  # 12 fair draws: all alike 1 in 2,048
    model_template = model_template_renderer(sglang_pool.model)
    for row in df.itertuples():
        assert row.finish_reason == "stop" and list(row.integrity_flags) == [], row.key
        assert list(row.output_token_ids) == sglang_cpu.OUTPUT_IDS, row.key
        if row.setting == "think":
            assert (row.reasoning, row.answer) == (sglang_cpu.REASONING, sglang_cpu.ANSWER)
            continue
        messages = json.loads(row.messages)
        prompt = render_prompt(messages, thinking=False)
        assert prompt == model_template(messages, thinking=False)  # chat_template: model too
        assert list(row.prompt_token_ids) == tk.encode(prompt)
        assert (row.reasoning, row.answer) == ("", sglang_cpu.TEXT)  # all of it the answer
        assert (row.reasoning_tokens, row.finished_thinking) == (0, True)  # SGLang's count
