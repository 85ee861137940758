"""The end-of-session line says what the session wrote."""

from jobs.runs.run import _session_rows


def test_a_fresh_session_counts_new_prompts():
    assert _session_rows({"session_rows": 5, "session_new_prompts": 5}) == \
        "5 rows written (5 new prompts)"


def test_a_continue_session_counts_continued_rows():
    assert _session_rows({"session_rows": 288, "session_new_prompts": 0}) == \
        "288 rows written (288 continued)"


def test_both_and_none():
    assert _session_rows({"session_rows": 7, "session_new_prompts": 2}) == \
        "7 rows written (2 new prompts, 5 continued)"
    assert _session_rows({"session_rows": 0, "session_new_prompts": 0}) == "0 rows written"
