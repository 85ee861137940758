"""Integrity flags (contract/integrity.py): each breakage named, a sound row clean."""

from __future__ import annotations

import pytest

from contract.integrity import (LOOP_MIN_TOKENS, TOKEN_RUN, integrity_flags, longest_run,
                                repetition_ratio)


def _row(**over):
    ids = list(range(100, 400))
    row = {"finish_reason": "stop", "finished_thinking": True, "reasoning": "think",
           "answer": "The answer.", "output_token_ids": ids, "repetition_ratio": repetition_ratio(ids)}
    row.update(over)
    return row


def test_a_sound_row_has_no_flags():
    assert integrity_flags(_row()) == []


@pytest.mark.parametrize("over, flag", [
    ({"answer": "  \n"}, "empty_answer"),
    ({"finished_thinking": False, "answer": ""}, "missing_think_end"),
    ({"output_token_ids": [7] + [0] * TOKEN_RUN}, "token_run"),
    ({"reasoning": "bad \ufffd byte"}, "replacement_char"),
    ({"answer": "x\ufffd"}, "replacement_char"),
])
def test_each_breakage_is_named(over, flag):
    assert flag in integrity_flags(_row(**over))


def test_a_loop_needs_length_and_a_high_repeat_share():
    loop = [1, 2, 3, 4, 5] * (LOOP_MIN_TOKENS // 5 + 1)
    assert "ngram_loop" in integrity_flags(_row(output_token_ids=loop,
                                                repetition_ratio=repetition_ratio(loop)))
    short = loop[:LOOP_MIN_TOKENS - 1]
    assert "ngram_loop" not in integrity_flags(_row(output_token_ids=short,
                                                    repetition_ratio=repetition_ratio(short)))


def test_a_row_cut_at_the_budget_is_not_empty_or_unfinished_by_itself():
    # finish_reason=length rows are truncated (export's own filter), not broken.
    assert integrity_flags(_row(finish_reason="length", finished_thinking=False, answer="")) == []


def test_a_run_just_below_the_limit_is_not_flagged():
    assert longest_run([0] * (TOKEN_RUN - 1) + [1]) == TOKEN_RUN - 1
    assert "token_run" not in integrity_flags(_row(output_token_ids=[0] * (TOKEN_RUN - 1)))
    assert longest_run([]) == 0 and longest_run(None) == 0
