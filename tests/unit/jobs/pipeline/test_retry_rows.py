"""jobs.pipeline.retry (breaker, backoff) and jobs.pipeline.rows helpers."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from ray.exceptions import ActorDiedError, RayTaskError

from jobs.pipeline.retry import (Breaker, CircuitOpen, FlaggedEverywhere, SystematicErrors,
                                 backoff_s, is_replica_bug, replica_error_class)
from jobs.pipeline.rows import repetition_ratio


# --- breaker ----------------------------------------------------------------------------

def test_breaker_waits_for_min_rows():
    breaker = Breaker(window_rows=100, min_rows=10, max_failure_fraction=0.5)
    for _ in range(9):
        breaker.record(True)  # 100% failures, but not enough rows for a verdict
    assert list(breaker.window) == [True] * 9  # recorded, and no verdict raised
    with pytest.raises(CircuitOpen, match="10 of the last 10 rows"):
        breaker.record(True)


def test_breaker_trips_only_above_fraction():
    breaker = Breaker(window_rows=10, min_rows=10, max_failure_fraction=0.5)
    for failure in [True, False] * 5:
        breaker.record(failure)  # 5 of 10: exactly the fraction, not above
    breaker.record(True)         # the oldest True slides out: still 5 of 10
    assert len(breaker.window) == 10 and sum(breaker.window) == 5
    with pytest.raises(CircuitOpen):
        breaker.record(True)     # the oldest False slides out: 6 of 10 > 50%


def test_breaker_tolerates_failures_below_fraction_and_window_slides():
    breaker = Breaker(window_rows=20, min_rows=5, max_failure_fraction=0.5)
    for i in range(200):
        breaker.record(i % 3 == 0)  # ~33% engine failures: never trips
    assert len(breaker.window) == 20
    assert 6 <= sum(breaker.window) <= 7  # the window holds the last 20 outcomes only


def test_breaker_old_failures_slide_out():
    breaker = Breaker(window_rows=10, min_rows=10, max_failure_fraction=0.5)
    for _ in range(5):
        breaker.record(True)     # below min_rows: no verdict yet
    for _ in range(100):
        breaker.record(False)    # the burst leaves the window
    for _ in range(5):
        breaker.record(True)     # 5 of 10 again: not above
    assert list(breaker.window) == [False] * 5 + [True] * 5
    with pytest.raises(CircuitOpen, match="6 of the last 10 rows"):
        breaker.record(True)     # the breaker still judges: 6 of 10 > 50%


def _flag_breaker(fraction=0.5) -> Breaker:
    return Breaker(window_rows=200, min_rows=50, max_failure_fraction=0.5,
                   max_flagged_fraction=fraction)


def _outputs(breaker, replicas, broken, n):
    """n data rows round-robin over ``replicas``; those in ``broken`` flagged."""
    for i in range(n):
        rep = replicas[i % len(replicas)]
        breaker.record_output(rep, ["missing_think_end"] if rep in broken else [], f"k{i}")


def test_one_broken_replica_of_two_or_eight_drains_and_never_stops_the_job():
    for replicas in (["a", "b"], [f"r{i}" for i in range(8)]):
        breaker = _flag_breaker()
        _outputs(breaker, replicas, {replicas[0]}, 1000)  # half the rows of two: not a verdict
    # a lone replica broken, then its replacement sound: a drain fixed it
    breaker = _flag_breaker()
    _outputs(breaker, ["old"], {"old"}, 64)
    _outputs(breaker, ["new"], set(), 500)


def test_outputs_broken_on_every_replica_stop_the_job_naming_the_flags_and_the_fix():
    breaker = _flag_breaker()
    with pytest.raises(FlaggedEverywhere) as info:
        _outputs(breaker, ["a", "b", "c"], {"a", "b", "c"}, 200)
    message = str(info.value)
    assert "50 of the last 50 rows are flagged" in message  # at min_rows, not later
    assert "on 3 of the 3 replicas" in message and "missing_think_end 50" in message
    assert "non-thinking model" in message and "key 'k49'" in message
    assert isinstance(info.value, CircuitOpen)  # the run reports it as the breaker's


def test_a_lone_replica_and_its_replacement_both_broken_stop_the_job():
    breaker = _flag_breaker()
    _outputs(breaker, ["old"], {"old"}, 64)  # one replica: its drain may fix it
    with pytest.raises(FlaggedEverywhere, match="on 2 of the 2 replicas"):
        _outputs(breaker, ["new"], {"new"}, 20)


def test_a_minority_of_broken_replicas_or_the_guard_turned_off_never_stops():
    breaker = _flag_breaker()
    _outputs(breaker, ["a", "b", "c", "d"], {"a", "b"}, 1000)  # 2 of 4: not a majority
    _outputs(_flag_breaker(None), ["a", "b"], {"a", "b"}, 1000)


def test_sessions_of_rows_chosen_by_their_output_get_no_fleet_wide_flags_verdict():
    from jobs.config import BreakerConfig
    from jobs.pipeline.generate_stage import stage_breaker
    from jobs.pipeline.modes import Mode, strategy
    plain = SimpleNamespace(breaker=BreakerConfig(), strategy=strategy(Mode.FRESH))
    assert stage_breaker(plain).max_flagged == 0.5
    for chosen in (dict(strategy=strategy(Mode.REGENERATE)),
                   dict(strategy=strategy(Mode.CONTINUE))):
        breaker = stage_breaker(SimpleNamespace(**{**vars(plain), **chosen}))
        assert breaker.max_flagged is None
        _outputs(breaker, ["a", "b"], {"a", "b"}, 500)  # loops gather there: no verdict


def test_breaker_message_tells_what_to_do():
    breaker = Breaker(window_rows=4, min_rows=4, max_failure_fraction=0.5)
    for failure in (True, True, True):
        breaker.record(failure)
    with pytest.raises(CircuitOpen) as info:
        breaker.record(False)
    msg = str(info.value)
    assert "3 of the last 4 rows" in msg
    assert "75% > job.breaker.max_failure_fraction 50%" in msg
    assert "--retry-failed" in msg
    assert "serve status" in msg


def test_breaker_fraction_one_never_trips():
    breaker = Breaker(window_rows=5, min_rows=1, max_failure_fraction=1.0)
    for _ in range(20):
        breaker.record(True)
    assert list(breaker.window) == [True] * 5  # judged 20 times, 100% is never "above"


# --- backoff ----------------------------------------------------------------------------

@pytest.mark.parametrize("attempt, cap", [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0),
                                          (6, 32.0), (7, 60.0), (20, 60.0)])
def test_backoff_within_growing_cap(attempt, cap):
    random.seed(attempt)
    values = [backoff_s(attempt, initial_s=1.0, max_s=60.0) for _ in range(300)]
    assert all(0 <= v <= cap for v in values)
    assert max(values) > cap * 0.8  # full jitter reaches near the cap
    assert min(values) < cap * 0.2  # ... and near zero


def test_backoff_zero_initial_is_zero():
    assert backoff_s(3, initial_s=0.0, max_s=60.0) == 0.0


def test_replica_error_class_labels():
    from ray.exceptions import ActorDiedError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
    assert replica_error_class(BackPressureError(num_queued_requests=1, max_queued_requests=1)) \
        == "replica_backpressure"
    assert replica_error_class(DeploymentUnavailableError("d")) == "deployment_unavailable"
    assert replica_error_class(ActorDiedError()) == "replica_unavailable"


# --- rows -------------------------------------------------------------------------------

def test_repetition_ratio_distinct_is_zero():
    assert repetition_ratio(list(range(1000))) == 0.0


def test_repetition_ratio_loop_is_high():
    loop = list(range(1, 6)) * 200  # a 5-token loop, 1000 tokens
    ratio = repetition_ratio(loop)
    assert ratio > 0.99
    assert ratio == pytest.approx(1 - 5 / (1000 - 3))


def test_repetition_ratio_partial_loop_in_between():
    ids = list(range(500)) + [7, 8, 9, 10] * 125
    assert 0.3 < repetition_ratio(ids) < 0.7


@pytest.mark.parametrize("ids", [[], [1], [1, 2, 3]])
def test_repetition_ratio_short_inputs(ids):
    assert repetition_ratio(ids) == 0.0


def test_repetition_ratio_exactly_n():
    assert repetition_ratio([1, 1, 1, 1]) == 0.0
    assert repetition_ratio([1, 1, 1, 1, 1]) == 0.5


# --- systematic (non-transient) errors ----------------------------------------------

def test_a_400_storm_trips_naming_the_error_and_the_fix():
    breaker = Breaker(window_rows=20, min_rows=10, max_failure_fraction=0.5,
                      max_same_error_fraction=0.8)
    with pytest.raises(SystematicErrors) as info:
        for _ in range(10):
            breaker.record(False, "bad_request", "HTTP 400: unknown field 'top_a'")
    msg = str(info.value)
    assert "10 of the last 10 rows" in msg and "'bad_request'" in msg
    assert "unknown field 'top_a'" in msg  # the error itself
    assert "job.sampling" in msg and "--retry-failed" in msg  # and the fix
    assert isinstance(info.value, CircuitOpen)  # the run ends failed like any breaker trip


def test_a_minority_of_bad_requests_never_trips():
    breaker = Breaker(window_rows=20, min_rows=10, max_failure_fraction=0.5,
                      max_same_error_fraction=0.8)
    for i in range(200):  # 50% of rows refused: the rows' fault, not the run's
        breaker.record(False, "bad_request" if i % 2 else None, "HTTP 400")
    assert sum(c == "bad_request" for c in breaker.classes) == 10


def test_mixed_classes_trip_only_when_one_dominates():
    breaker = Breaker(window_rows=10, min_rows=10, max_failure_fraction=0.5,
                      max_same_error_fraction=0.8)
    for i in range(10):  # all failed, but 50/50 between two classes: not one cause
        breaker.record(False, "bad_request" if i % 2 else "replica_error", "x")
    tripped_after = None
    with pytest.raises(SystematicErrors, match="replica_error.*Serve replica logs"):
        for n in range(1, 11):
            tripped_after = n
            breaker.record(False, "replica_error", "KeyError: 'x'")
    assert tripped_after == 8  # 5 + 8 - 4 slid out = 9 of 10 > 80% (8 of 10 is not above)


def test_replica_bug_is_told_from_a_dead_replica():
    bug = RayTaskError("generate_many", "tb", KeyError("max_new_tokens"))
    dead = RayTaskError("generate_many", "tb", ActorDiedError())
    assert is_replica_bug(bug) and replica_error_class(bug) == "replica_error"
    assert not is_replica_bug(dead) and replica_error_class(dead) == "replica_unavailable"
    assert not is_replica_bug(ActorDiedError())
    # An engine fault the replica raises on purpose (Serve replaces it): retried as such.
    from contract.outcomes import EngineDead
    engine_dead = RayTaskError("generate_many", "tb", EngineDead("engine process exited"))
    assert not is_replica_bug(engine_dead)
    assert replica_error_class(engine_dead) == "engine_dead"


def test_context_overflow_is_a_failure_that_retry_failed_can_resend():
    # It used to become a reject (skipped forever by a rerun); now it is a failure row,
    # which --retry-failed sends again after a context length or policy change.
    from jobs.pipeline.rows import failure_row
    row = {"key": "k", "id": "k", "category": "c", "messages": "[]", "tools": None,
           "source": "p.jsonl", "line": 3}
    stage = SimpleNamespace(settings_hash="h", continue_to=None)
    out = failure_row(row, "context_overflow", "prompt 9000 + budget 8192 > 16384", 1, stage)
    assert out["_kind"] == "failures" and out["error_class"] == "context_overflow"
    assert out["retryable"] is False
    assert (out["source"], out["line"]) == ("p.jsonl", 3)
