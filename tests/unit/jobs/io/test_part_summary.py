"""jobs.io.part_summary's pure helpers."""

from __future__ import annotations

import pytest

from jobs.io.part_summary import reject_reason_class


@pytest.mark.parametrize("reason, label", [
    ("duplicate id 'k': first seen at f:1", "duplicate_id"),
    ("context_overflow: prompt 9000 + budget 8192 > 16384", "context_overflow"),
    ("not valid JSON: Expecting value at column 1", "invalid_json"),
    ("'messages' is empty", "invalid_row"),
    ("messages[0].role 'x' is not one of system, user, assistant, tool", "invalid_row"),
    ("", "invalid_row"),
])
def test_reject_reason_class(reason, label):
    assert reject_reason_class(reason) == label
