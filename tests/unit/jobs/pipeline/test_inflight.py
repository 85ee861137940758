"""jobs.pipeline.inflight: the adaptive rows in flight, fed engine loads in virtual time.

Each test drives the controller with the load reports a replica would send
(serve_apps/engine_load.py) on a clock it sets by hand; then a sender in virtual time
shows the limit really bounds the rows in flight and follows an engine that retracts.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from jobs.pipeline.inflight import (BACKOFF, CAREFUL, COOLDOWN_S, DECIDE_S, GROW_S,
                                    HIGH_WATER, PROBE_S, START, InflightControl,
                                    queue_target)
from jobs.pipeline.row_sender import RowSender
from tests.support.virtual_time import VirtualClock, run_virtual


def load(replica="r1", running=4, queued=0, usage=0.3, retracted=0, cap=48):
    return {"replica": replica, "cap": cap, "inflight": running + queued, "running": running,
            "queued": queued, "token_usage": usage, "retracted": retracted, "age_s": 0.1}


def control(lo=1, hi=64, start=8):
    clock = VirtualClock()
    return InflightControl(lo, hi, start=start, clock=clock.monotonic), clock


def step(ctl, clock, report, dt=DECIDE_S):
    clock.now += dt
    return ctl.observe(report)


def test_bounds_are_checked_and_the_start_is_small_within_them():
    with pytest.raises(ValueError, match="1 <= lo <= hi"):
        InflightControl(0, 4)
    with pytest.raises(ValueError, match=r"\[5, 4\]"):
        InflightControl(5, 4)
    assert InflightControl(1, 128).limit == START == 4
    assert InflightControl(1, 2).limit == 2 and InflightControl(6, 8).limit == 6


def test_with_room_it_doubles_until_the_most_and_no_further():
    ctl, clock = control(hi=64, start=8)
    limits = [step(ctl, clock, load()) for _ in range(5)]
    assert limits == [16, 32, 64, 64, 64]


def test_slow_start_ends_once_a_pool_is_half_full():
    ctl, clock = control(hi=64, start=8)
    assert step(ctl, clock, load(usage=CAREFUL)) == 9 and not ctl.slow_start
    assert step(ctl, clock, load(usage=CAREFUL)) == 9  # then a row per GROW_S
    assert step(ctl, clock, load(usage=CAREFUL)) == 10


def test_one_decision_per_interval_however_many_results_arrive():
    ctl, clock = control(start=8)
    step(ctl, clock, load())
    for _ in range(20):  # a burst of results within one interval
        clock.now += DECIDE_S / 40
        ctl.observe(load())
    assert ctl.limit == 16


def test_a_retraction_cuts_by_the_backoff_once_per_burst_then_growth_is_a_slow_probe():
    ctl, clock = control(start=32)
    step(ctl, clock, load(retracted=3))          # first sight: a baseline, not a signal
    assert ctl.limit == 64
    assert step(ctl, clock, load(retracted=5)) == int(64 * BACKOFF)
    cut = ctl.limit
    assert step(ctl, clock, load(retracted=9)) == cut  # same burst: within the cooldown
    clock.now += COOLDOWN_S
    assert not ctl.slow_start and ctl.ceiling == 64
    # from where the retraction cut to: one row per PROBE_S, however much room is reported
    limits = [step(ctl, clock, load(retracted=9)) for _ in range(int(3 * PROBE_S / DECIDE_S))]
    assert limits[-1] == cut + 3 and limits.count(cut + 1) == PROBE_S / DECIDE_S


def test_after_slow_start_growth_is_a_row_per_engine_per_second():
    ctl, clock = control(start=8)
    assert ctl.observe(load("a", usage=CAREFUL)) == 9  # slow start ends: a row, one engine
    clock.now += GROW_S
    ctl.engines["b"] = (clock.now, load("b"))
    assert ctl.observe(load("a")) == 11  # two engines: two rows
    assert step(ctl, clock, load("a")) == 11  # then not before GROW_S


def test_a_retraction_after_the_cooldown_cuts_again_and_never_below_the_least():
    ctl, clock = control(lo=3, start=8)
    step(ctl, clock, load(retracted=0))
    retracted = 0
    for _ in range(10):
        retracted += 1
        clock.now += COOLDOWN_S
        ctl.observe(load(retracted=retracted))
    assert ctl.limit == 3 and ctl.decisions["retraction"] >= 3


def test_a_full_pool_with_a_queue_past_its_target_gives_back_a_row_per_decision():
    ctl, clock = control(start=20)
    assert step(ctl, clock, load(usage=HIGH_WATER, queued=2)) == 19
    assert step(ctl, clock, load(usage=0.95, queued=3)) == 18
    # full with a short queue (what replaces a finished row at once), or none: hold
    assert step(ctl, clock, load(usage=0.97, queued=1)) == 18
    assert step(ctl, clock, load(usage=0.97, queued=0)) == 18
    assert ctl.decisions["full"] == 2


def test_a_long_enough_queue_holds_the_limit():
    ctl, clock = control(start=20)
    assert queue_target(4) == 2 and queue_target(48) == pytest.approx(4.8)
    assert step(ctl, clock, load(running=4, queued=2)) == 20
    assert step(ctl, clock, load(running=48, queued=5)) == 20
    assert step(ctl, clock, load(running=48, queued=4)) == 40


def test_every_engine_counts_one_full_engine_stops_the_growth_of_all():
    ctl, clock = control(start=8)
    assert ctl.observe(load("a")) == 16  # the first report decides at once
    assert step(ctl, clock, load("b", usage=0.4)) == 32
    assert step(ctl, clock, load("a", usage=0.93, queued=0)) == 32  # a is hot: hold
    # a retraction on any engine is a signal, whichever engine answered this result
    ctl.engines["a"] = (clock.now, load("a", retracted=2))
    assert step(ctl, clock, load("b")) == int(32 * BACKOFF)


def test_a_replica_not_heard_from_is_forgotten_and_a_report_without_load_is_ignored():
    ctl, clock = control(start=8)
    assert ctl.observe(load("gone", usage=0.99, queued=5)) == 7  # full, a queue past target
    clock.now += 61
    assert ctl.observe(load("new")) == 8  # gone is forgotten: room again (additive now)
    assert set(ctl.engines) == {"new"}
    clock.now += GROW_S
    assert ctl.observe(None) == 9  # an older replica sends no load: the rest decide


class Engine:
    """A handle whose engine runs ``fits`` rows at once; every row past that retracts
    (its counter rises) and each row takes ``row_s``."""

    def __init__(self, fits: int, row_s: float = 1.0):
        self.fits, self.row_s = fits, row_s
        self.inflight = self.peak = self.retracted = 0
        self.calls: list[int] = []
        self.started: list[int] = []

    def options(self, stream):
        return self

    @property
    def generate_many(self):
        return self

    def remote(self, requests):
        self.calls.append(len(requests))
        self.started.append(self.inflight + len(requests))  # rows in the engine with it
        return self._stream(requests)

    async def _stream(self, requests):
        for _ in requests:
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            self.retracted += max(0, self.inflight - self.fits)
        for request in requests:
            await asyncio.sleep(self.row_s)
            self.inflight -= 1
            running = min(self.inflight, self.fits)
            yield SimpleNamespace(key=request.key, request_id=request.request_id, load={
                "replica": "r1", "cap": 48, "inflight": self.inflight, "running": running,
                "queued": self.inflight - running, "token_usage": running / self.fits,
                "retracted": self.retracted, "age_s": 0.0})


def run_rows(engine, control, rows=400, inflight=64):
    sender = RowSender(engine, inflight_rows=inflight, rows_per_call=16, linger_s=0.05,
                       control=control)

    async def main():
        await asyncio.gather(*(sender.send(SimpleNamespace(key=f"k{i}"))
                               for i in range(rows)))

    run_virtual(main)
    return sender


def test_a_fixed_sender_overfills_the_engine_and_an_adaptive_one_settles_below_its_fit():
    fixed = Engine(fits=8)
    run_rows(fixed, None)
    assert fixed.peak == 64 and fixed.retracted > 1000

    adaptive = Engine(fits=8)
    clock = VirtualClock()
    sender = RowSender(adaptive, inflight_rows=64, rows_per_call=16, linger_s=0.05,
                       control=InflightControl(1, 64, start=4, clock=clock.monotonic))

    async def main():
        await asyncio.gather(*(sender.send(SimpleNamespace(key=f"k{i}")) for i in range(400)))

    run_virtual(main, clock)
    assert adaptive.retracted < fixed.retracted / 20, (adaptive.retracted, fixed.retracted)
    assert 4 <= sender.limit <= 12, (sender.limit, adaptive.retracted, fixed.retracted)
    # while the limit is small, calls are small: each engine gets calls, not one big one
    assert max(adaptive.calls[5:]) <= 8


def test_a_lowered_limit_takes_no_row_back_and_holds_the_next_until_rows_finish():
    engine = Engine(fits=100, row_s=1.0)
    clock = VirtualClock()
    ctl = InflightControl(1, 64, start=16, clock=clock.monotonic)
    sender = RowSender(engine, inflight_rows=64, rows_per_call=16, linger_s=0.05, control=ctl)

    async def main():
        rows = [asyncio.ensure_future(sender.send(SimpleNamespace(key=f"k{i}")))
                for i in range(40)]
        await asyncio.sleep(0.1)
        assert sender._busy == engine.inflight == 16
        ctl.limit = ctl.hi = 4  # as a retraction would (and no growth after it)
        await asyncio.gather(*rows)

    run_virtual(main, clock)
    assert sender.peak_busy == 16 and sender._busy == 0
    later = engine.started[2:]  # the calls after the cut (the first two: 8 rows each)
    assert later and max(later) <= 4, engine.started
