"""The session watchdog (jobs/runs/watchdog.py): when a session counts as stalled, and
how the stuck stage is named from the replicas' reports."""

from __future__ import annotations

import pytest

from jobs.runs.watchdog import Watchdog, describe_stage


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_before_the_first_part_the_limit_is_the_longest_a_first_row_may_take():
    clock = Clock()
    dog = Watchdog(factor=5, min_s=30, first_part_s=120, clock=clock)
    dog.observe(4)  # the parts the run held before this session
    clock.t = 149
    assert dog.observe(4) is None
    clock.t = 151
    assert dog.observe(4) == (151, 150)
    clock.t = 500
    assert dog.observe(4) is None  # it fires once


def test_after_parts_the_limit_follows_the_longest_gap_seen():
    clock = Clock()
    dog = Watchdog(factor=5, min_s=30, first_part_s=3600, clock=clock)
    dog.observe(0)
    for t, parts in ((20, 1), (30, 2), (42, 3)):  # gaps 20, 10, 12
        clock.t = t
        assert dog.observe(parts) is None
    assert dog.limit_s() == 100  # 5 x the longest gap (20)
    clock.t = 142
    assert dog.observe(3) is None
    clock.t = 143
    silent, limit = dog.observe(3)
    assert (round(silent), limit) == (101, 100)


def test_the_limit_never_drops_below_min_s():
    clock = Clock()
    dog = Watchdog(factor=5, min_s=60, first_part_s=10, clock=clock)
    dog.observe(0)
    clock.t = 1
    dog.observe(1)  # parts every second: 5 s would be the factor's limit
    assert dog.limit_s() == 60


NOW = 10_000.0


def test_a_replica_holding_rows_without_results_names_generate():
    infos = [{"replica": "a", "inflight": 12, "last_result_at": NOW - 900},
             {"replica": "b", "inflight": 0, "last_result_at": NOW - 950}]
    text = describe_stage(infos, 0, limit_s=300, now=NOW)
    assert text.startswith("stuck stage: generate") and "a (12 rows in flight)" in text


def test_replicas_finishing_rows_while_nothing_is_durable_names_write():
    infos = [{"replica": "a", "inflight": 3, "last_result_at": NOW - 2}]
    assert describe_stage(infos, 0, 300, NOW).startswith("stuck stage: write")


def test_idle_replicas_name_the_stages_before_them():
    infos = [{"replica": "a", "inflight": 0, "last_result_at": NOW - 1000}]
    text = describe_stage(infos, 2, 300, NOW)
    assert "generate actors" in text and "2 info calls unanswered" in text


def test_no_replica_answering_names_the_replicas():
    assert "none answered" in describe_stage([], 8, 300, NOW)


def test_a_session_started_with_sigint_ignored_can_still_be_interrupted():
    """`nohup python -m jobs.generate ... &` starts Python with SIGINT ignored: the
    watchdog's and the fence's interrupt_main then did nothing, and a stalled session
    hung on with its lease (found when the suite itself ran under `nohup ... &`)."""
    import _thread
    import signal
    import time

    from jobs.runs.run import interruptible_main_thread
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _thread.interrupt_main()
        time.sleep(0.05)  # nothing happens: what the watchdog met
        interruptible_main_thread()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            _thread.interrupt_main()
            time.sleep(1)  # raised at the next bytecode, well before this ends

        def own(*_):
            pass
        signal.signal(signal.SIGINT, own)
        interruptible_main_thread()  # a handler the process set itself stays
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)
