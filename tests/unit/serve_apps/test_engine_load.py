"""serve_apps.engine_load: the four values read off an engine's /metrics, and the probe
that refreshes them on demand (at most once per period, never two scrapes at once)."""

from __future__ import annotations

import asyncio
import logging

from serve_apps.engine_load import LoadProbe, read_load
from tests.support.virtual_time import VirtualClock, run_virtual

PAGE = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="0"} 7.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",tp_rank="0"} 3.0
sglang:token_usage{engine_type="unified",model_name="m",tp_rank="0"} 0.82
sglang:num_retracted_requests_total{engine_type="unified",model_name="m",pid="9"} 5.0
sglang:num_retracted_reqs{engine_type="unified",model_name="m"} 2.0
sglang:token_usage_bucket{le="0.5"} 99.0
sglang:num_running_reqs_extra 11.0
sglang:num_queue_reqs{broken} not-a-number
"""


def test_the_four_values_are_read_and_nothing_else():
    assert read_load(PAGE) == {"running": 7.0, "queued": 3.0, "token_usage": 0.82,
                               "retracted": 5.0}


def test_a_page_without_a_value_reads_it_as_zero():
    # SGLang writes the retraction counter only from its first retraction
    assert read_load("sglang:num_running_reqs 2\n") == {
        "running": 2.0, "queued": 0.0, "token_usage": 0.0, "retracted": 0.0}


def test_the_probe_scrapes_on_demand_at_most_once_per_period():
    clock = VirtualClock()
    scrapes = []

    async def metrics_text():
        scrapes.append(clock.now)
        await asyncio.sleep(0.2)  # a slow page: results keep coming meanwhile
        return PAGE

    async def main():
        probe = LoadProbe(metrics_text, cap=48, replica="r1", period_s=0.5,
                          clock=clock.monotonic)
        first = probe.snapshot(inflight=4)
        assert first["age_s"] is None and first["running"] == 0.0  # nothing read yet
        for _ in range(10):  # results every 0.1 s
            await asyncio.sleep(0.1)
            last = probe.snapshot(inflight=9)
        return first, last

    first, last = run_virtual(main, clock)
    assert first["replica"] == "r1" and first["cap"] == 48 and first["inflight"] == 4
    assert last["running"] == 7.0 and last["retracted"] == 5.0 and last["inflight"] == 9
    assert 0 <= last["age_s"] <= 0.5 + 0.2 + 0.1 + 1e-6  # period + a scrape + a result
    # one at 0, then one each time the values had aged past the period: not one per result
    assert len(scrapes) == 2 and scrapes[0] == 0.0, scrapes


def test_a_failed_scrape_keeps_the_last_values_ageing_and_is_logged_once(caplog):
    clock = VirtualClock()
    pages = [PAGE, OSError("engine busy"), OSError("engine busy")]

    async def metrics_text():
        page = pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return page

    async def main():
        probe = LoadProbe(metrics_text, cap=8, replica="r1", period_s=0.5,
                          clock=clock.monotonic)
        await probe.refresh()
        for _ in range(3):
            await asyncio.sleep(0.6)
            snap = probe.snapshot(inflight=1)
        await asyncio.sleep(0.01)
        return snap

    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        snap = run_virtual(main, clock)
    assert snap["running"] == 7.0 and snap["age_s"] > 1.0
    assert sum("engine load scrape failed" in r.message for r in caplog.records) == 1
