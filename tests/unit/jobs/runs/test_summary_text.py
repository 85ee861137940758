"""The end-of-session line says what the session wrote."""

from jobs.runs.run import _session_rows


def test_a_fresh_session_counts_new_prompts():
    assert _session_rows({"session_rows": 5, "session_new_prompts": 5}) == \
        "5 rows written: 5 new prompts"


def test_a_continue_session_counts_continued_rows_and_the_tokens_they_added():
    snap = {"session_rows": 288, "session_new_prompts": 0, "session_new_versions": 288,
            "session_tokens_added": 1_234_567}
    assert _session_rows(snap) == "288 rows written: 288 continued (+1,234,567 tokens)"
    assert _session_rows(dict(snap, session_tokens_added=-12), "regenerated") == \
        "288 rows written: 288 regenerated (-12 tokens)"


def test_retried_failures_and_keys_lost_to_damaged_parts_are_named():
    snap = {"session_rows": 9, "session_new_prompts": 9, "session_retried_failures": 3,
            "session_regenerated_damaged": 4, "session_new_versions": 0}
    assert _session_rows(snap) == \
        "9 rows written: 9 new prompts (3 retried failures, 4 lost to damaged parts)"


def test_both_and_none():
    assert _session_rows({"session_rows": 7, "session_new_prompts": 2}) == \
        "7 rows written: 2 new prompts, 5 continued"
    assert _session_rows({"session_rows": 0, "session_new_prompts": 0}) == "0 rows written"


def test_an_n_sample_session_counts_samples_not_prompts():
    snap = {"session_rows": 400, "session_new_prompts": 400, "session_retried_failures": 2}
    assert _session_rows(snap, samples=4) == \
        "400 rows written: 400 new samples, 4 per prompt (2 retried failures)"
