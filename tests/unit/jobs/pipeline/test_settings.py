"""jobs.pipeline.settings.RunMode: the jobs.generate flags become one explicit mode."""

from __future__ import annotations

import pytest

from jobs.pipeline.settings import CONTINUE, FRESH, PILOT, RETRY_FAILED, RunMode


@pytest.mark.parametrize("flags, mode", [
    ({}, RunMode(FRESH)),
    ({"retry_failed": True}, RunMode(RETRY_FAILED, retry_failed=True)),
    ({"continue_truncated": True, "max_total_tokens": 8192}, RunMode(CONTINUE, continue_to=8192)),
    # --retry-failed has no effect on a continue run (as before the modes were explicit)
    ({"continue_truncated": True, "max_total_tokens": 8192, "retry_failed": True},
     RunMode(CONTINUE, continue_to=8192)),
    ({"pilot": 50}, RunMode(PILOT, pilot_rows=50)),
    ({"pilot": 50, "retry_failed": True}, RunMode(PILOT, retry_failed=True, pilot_rows=50)),
])
def test_flags_become_one_mode(flags, mode):
    assert RunMode.of_flags(**flags) == mode


def test_continue_without_a_total_is_still_a_continue_mode_its_plan_refuses():
    mode = RunMode.of_flags(continue_truncated=True)
    assert mode.continues and mode.continue_to is None
