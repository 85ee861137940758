"""Idle GPU-seconds from the engines' own idle counters (jobs/runs/engine_idle.py), and
what a replica publishes for them (serve_apps/engine_clock.py): fake counter series."""

from __future__ import annotations

import json

import pytest

from jobs.runs.engine_idle import EXTRAPOLATE_S, EngineIdleWatch, describe, engine_split, idle_gpu_seconds
from serve_apps.engine_clock import IDLE_COUNTER, SAMPLES_KEPT, EngineClock


def record(samples, replica="r1", started_at=0.0, ready_at=1.0):
    return {"format": 1, "app": "a", "replica": replica, "started_at": started_at,
            "ready_at": ready_at, "samples": [list(s) for s in samples]}


# One engine, scraped every 5 s; the session's window opens at 100: idle until 110
# (ramp), busy 110-130, idle again from 130 (tail). Counter: idle seconds since start.
SERIES = [(95, 50, False), (100, 55, False), (105, 60, False), (110, 65, False),
          (115, 65, True), (120, 65, True), (125, 65, True), (130, 65, False), (135, 70, False)]


def test_ramp_and_tail_from_the_counter():
    split = engine_split(record(SERIES), 100, 135)
    assert (split.ramp, split.tail, split.other, split.restarts) == (10, 5, 0, 0)


def test_window_edges_between_scrapes_are_interpolated_and_extrapolated():
    # t0 inside an idle interval; t1 3 s after the last (idle) scrape: the counter ran on.
    split = engine_split(record(SERIES), 102.5, 138)
    assert split.ramp == pytest.approx(7.5) and split.tail == pytest.approx(8)
    # A busy last scrape: the counter stands still past it.
    busy_end = SERIES[:6]
    assert engine_split(record(busy_end), 100, 124).tail == 0


def test_a_gone_engine_is_extrapolated_only_so_far():
    split = engine_split(record(SERIES), 100, 400)
    assert split.tail == pytest.approx(5 + EXTRAPOLATE_S)


def test_idle_between_work_is_other_and_a_partly_idle_interval_is_work():
    series = [(100, 0, True), (105, 0, True), (110, 5, False), (115, 8, True), (120, 8, True),
              (125, 8, False)]
    split = engine_split(record(series), 100, 125)
    # [105,110] fully idle between work; [110,115] idle 3 of 5 s: an interval with work,
    # its idle between work too.
    assert (split.ramp, split.other, split.tail) == (0, 8, 0)


def test_replica_started_in_the_session_counts_its_start_up_as_restarts():
    # Replaced: the new engine started at 120, ready at 150 (model load); first scrape 152
    # shows 2 s idle since its scheduler started, busy from 155.
    series = [(152, 2, False), (155, 2, True), (160, 2, True), (165, 2, False)]
    split = engine_split(record(series, started_at=120, ready_at=150), 100, 165)
    assert split.restarts == 30
    assert split.ramp == pytest.approx(2) and split.tail == 0


def test_a_counter_reset_is_read_as_a_restart_of_the_count():
    series = [(100, 40, False), (105, 45, False), (110, 1, False), (115, 6, False)]
    split = engine_split(record(series), 100, 115)  # after the reset: counted from 0
    assert split.total == pytest.approx(5 + 1 + 5)


def test_sum_over_engines_in_gpu_seconds_and_none_without_counters():
    a, b = record(SERIES, "r1"), record(SERIES, "r2")
    idle = idle_gpu_seconds([a, b], 100, 135, gpus_per_engine=2)
    assert idle == {"total": 60.0, "ramp": 40.0, "tail": 20.0, "restarts": 0.0, "other": 0.0,
                    "engines": 2}
    assert idle_gpu_seconds([a], 100, 135, gpus_per_engine=0)["total"] == 15  # a CPU engine: 1
    assert idle_gpu_seconds([], 100, 135) is None
    gone = record([(10, 5, False), (15, 10, False)], "old")  # a replica of an earlier session
    assert engine_split(gone, 100, 135) is None
    assert idle_gpu_seconds([a, gone], 100, 135)["engines"] == 1
    assert "not reported" in describe(None)
    assert describe(idle).startswith("  idle GPU:  60.0 GPU-s over 2 engines (ramp 40.0")


def test_watch_keeps_every_sample_although_a_record_holds_only_the_last_few():
    """Each poll sees a sliding window of 3 samples; the engine's key then disappears
    (a replica that stopped): the watch still counts what it saw."""
    now = {"t": 100.0}
    polls = [SERIES[1:4], SERIES[3:6], SERIES[5:8], SERIES[6:9], []]
    calls = iter(polls)

    def read(app):
        assert app == "app"
        window = next(calls)
        return [record(window)] if window else []

    watch = EngineIdleWatch("app", 1, read=read, clock=lambda: now["t"])
    for t in (110, 120, 130, 135, 135):
        now["t"] = t
        idle = watch()
    assert (idle["ramp"], idle["tail"], idle["engines"]) == (10, 5, 1)


def test_watch_keeps_the_last_figure_when_a_read_fails():
    state = {"fail": False}

    def read(app):
        if state["fail"]:
            raise ConnectionError("GCS unreachable")
        return [record(SERIES)]

    watch = EngineIdleWatch("app", 1, read=read, clock=lambda: 135.0)
    watch.started = 100.0
    first = watch()
    state["fail"] = True
    assert watch() == first and first["total"] == 15


def test_engine_clock_publishes_the_counter_with_its_state():
    stored = {}
    clock = EngineClock("app", "rep", started_at=10.0, ready_at=20.0,
                        put=lambda k, v: stored.__setitem__(k, v), delete=stored.pop)
    assert not clock.publish({"sglang:num_running_reqs": 3.0}, now=30.0)  # no idle counter
    assert stored == {}
    assert clock.publish({IDLE_COUNTER: 4.5, "sglang:num_queue_reqs": 2.0}, now=31.0)
    assert clock.publish({IDLE_COUNTER: 9.5}, now=36.0)
    value = json.loads(stored["engine-clock/app/rep"])
    assert value["samples"] == [[31.0, 4.5, True], [36.0, 9.5, False]]
    assert (value["started_at"], value["ready_at"], value["format"]) == (10.0, 20.0, 1)
    for t in range(SAMPLES_KEPT + 5):
        clock.publish({IDLE_COUNTER: float(t)}, now=100.0 + t)
    assert len(json.loads(stored["engine-clock/app/rep"])["samples"]) == SAMPLES_KEPT
    clock.close()
    assert stored == {}


class _Gauge:
    def __init__(self, name, description="", tag_keys=()):
        self.tag_keys = tuple(tag_keys)

    def set(self, value, tags):
        pass


def test_the_relay_keeps_the_values_the_clock_publishes(monkeypatch):
    """The relay parses the engine's page once; the clock reads the idle counter and the
    work gauges from it (summed over label sets), and nothing stale from an older page."""
    from serve_apps import replica_metrics
    monkeypatch.setattr(replica_metrics.metrics, "Gauge", _Gauge)
    relay = replica_metrics.ReplicaMetrics("m").engine
    relay.relay('# TYPE sglang:scheduler_idle_seconds counter\n'
                'sglang:scheduler_idle_seconds_total{model_name="m",tp_rank="0"} 12.5\n'
                'sglang:num_running_reqs{model_name="m",tp_rank="0"} 2.0\n'
                'sglang:num_running_reqs{model_name="m",tp_rank="1"} 3.0\n'
                'sglang:gen_throughput{model_name="m"} 99.0\n')
    assert relay.values == {IDLE_COUNTER: 12.5, "sglang:num_running_reqs": 5.0}
    relay.relay('sglang:num_queue_reqs{model_name="m"} 1.0\n')  # an engine without the counter
    assert relay.values == {"sglang:num_queue_reqs": 1.0}


def test_held_gpu_seconds_from_engine_start_or_session_start_to_the_last_scrape():
    """The session's GPU-hours: an engine up before the session counts from the session's
    start, one started during it from its start (its model load held the GPU too), one
    gone from its last scrape (+ the extrapolation), and an old crashed replica's key
    not at all."""
    from jobs.runs.engine_idle import held_gpu_seconds, held_seconds
    up = record(SERIES, "r1", started_at=0.0)          # scraped 95..135
    late = record([(152, 2, False), (165, 2, False)], "r2", started_at=120, ready_at=150)
    gone = record([(10, 5, False)], "old")
    assert held_seconds(up, 90, 140) == 50              # session start to now
    assert held_seconds(up, 90, 400) == 135 + EXTRAPOLATE_S - 90
    assert held_seconds(late, 90, 170) == 50            # from its engine's start
    assert held_seconds(gone, 90, 170) == 0
    held = held_gpu_seconds([up, late, gone], 90, 140, gpus_per_engine=1)
    assert held == {"gpu_s": 50 + 20, "engines": 2}
    assert held_gpu_seconds([up], 90, 140, gpus_per_engine=0)["gpu_s"] == 50  # engine-s
    assert held_gpu_seconds([up], 90, 140, gpus_per_engine=2)["gpu_s"] == 100
    assert held_gpu_seconds([], 90, 140) is None


def test_watch_counts_held_time_from_the_sessions_deploy():
    now = {"t": 130.0}
    watch = EngineIdleWatch("app", 1, read=lambda app: [record(SERIES)],
                            clock=lambda: now["t"], held_since=90.0)
    assert watch.held is None  # nothing polled yet
    watch()
    assert watch.held == {"gpu_s": 40.0, "engines": 1}
    assert watch.started == 130.0  # idle still counts from the engines' readiness
