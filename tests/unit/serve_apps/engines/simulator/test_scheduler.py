"""Timing model, in-process (no HTTP): wall times follow the continuous-batching arithmetic."""

import asyncio
import time

import pytest

from serve_apps.engines.simulator.scheduler import Scheduler

# Lower bounds allow 1 ms: asyncio may wake a sleeper up to its clock resolution early,
# and CI saw 0.09995 s for a 0.1 s wait.
SLACK_S = 0.001


def make(**kw) -> Scheduler:
    base = dict(
        max_running_requests=48,
        per_request_decode_tok_s=100.0,
        max_decode_tok_s=3500.0,
        prefill_tok_s=20000.0,
        time_scale=0.01,
        context_length=32768,
    )
    base.update(kw)
    return Scheduler(**base)


async def timed(s: Scheduler, *args, **kw) -> float:
    t = time.monotonic()
    await s.run(*args, **kw)
    return time.monotonic() - t


def test_single_request_decodes_at_per_request_speed():
    async def go():
        s = make(time_scale=0.01)
        return await timed(s, 10, 10, 2000), s.stats()

    elapsed, st = asyncio.run(go())
    assert 0.2 - SLACK_S <= elapsed < 0.6  # 2000 tok / 100 tok/s = 20 sim s = 0.2 wall s
    assert (st.generation_tokens_total, st.prompt_tokens_total, st.requests_total, st.running, st.queued) == (2000, 10, 1, 0, 0)


def test_prefill_time_then_decode():
    async def go():
        s = make(time_scale=0.01, prefill_tok_s=1000.0)
        return await timed(s, 20000, 20000, 100)

    elapsed = asyncio.run(go())
    assert 0.2 + 0.01 - SLACK_S <= elapsed < 0.6  # 20 sim s prefill + 1 sim s decode


def test_aggregate_cap_is_shared():
    async def go():
        s = make(time_scale=0.01, max_decode_tok_s=200.0)
        # 4 requests: each gets min(100, 200/4) = 50 tok/s -> 500 tokens take 10 sim s = 0.1 wall s.
        return await asyncio.gather(*(timed(s, 1, 1, 500) for _ in range(4)))

    for elapsed in asyncio.run(go()):
        # lower bound: the cap is shared (unshared would be 0.05)
        assert 0.1 - SLACK_S <= elapsed < 0.4


def test_queue_is_fifo_and_bounded_by_max_running():
    async def go():
        s = make(time_scale=0.01, max_running_requests=2)
        seen = []

        async def watch():
            while True:
                st = s.stats()
                seen.append((st.running, st.queued))
                await asyncio.sleep(0.005)

        w = asyncio.create_task(watch())
        times = await asyncio.gather(*(timed(s, 1, 1, 1000) for _ in range(6)))
        w.cancel()
        return times, seen

    times, seen = asyncio.run(go())
    assert max(r for r, _ in seen) == 2 and max(q for _, q in seen) == 4
    # Three waves of 0.1 s each; FIFO order means later submissions finish later.
    for wave, t in zip((1, 1, 2, 2, 3, 3), times):
        assert 0.1 * wave - SLACK_S <= t < 0.1 * wave + 0.3
    assert max(times[:2]) < min(times[2:4]) and max(times[2:4]) < min(times[4:])  # FIFO across waves


def test_slow_requests_take_slow_factor_longer():
    async def go():
        s = make(time_scale=0.02)
        return await asyncio.gather(timed(s, 1, 1, 500), timed(s, 1, 1, 500, slow_factor=4.0))

    fast, slow = asyncio.run(go())
    # 500 tokens: 5 sim s = 0.1 wall s; four times slower = 0.4 wall s.
    assert 0.1 - SLACK_S <= fast < 0.35 and 0.4 - SLACK_S <= slow < 0.8


def test_zero_latency_mode_never_waits_but_counts():
    async def go():
        s = make(time_scale=0.0)
        t = time.monotonic()
        for _ in range(1000):
            await s.run(100, 100, 4096, verify_steps=1366)
        return time.monotonic() - t, s.stats()

    elapsed, st = asyncio.run(go())
    assert elapsed < 2.0  # 4M tokens at 3500 tok/s would be 1170 sim s if it waited
    assert st.generation_tokens_total == 4_096_000 and st.requests_total == 1000 and st.prompt_tokens_total == 100_000
    assert st.capacity_tok_s == 0.0 and st.running == 0
    assert st.spec_accept_length == pytest.approx(4096 / 1366)


def test_cancel_frees_the_slot():
    async def go():
        s = make(time_scale=0.01, max_running_requests=1)
        hog = asyncio.create_task(s.run(1, 1, 100_000))
        await asyncio.sleep(0.02)
        waiting = asyncio.create_task(timed(s, 1, 1, 100))
        await asyncio.sleep(0.02)
        assert s.stats().queued == 1
        hog.cancel()
        elapsed = await waiting
        return elapsed, s.stats()

    elapsed, st = asyncio.run(go())
    assert elapsed < 2.0 and st.running == 0 and st.requests_total == 1  # the hog (10 s wall) was dropped


def test_metrics_while_running():
    async def go():
        s = make(time_scale=0.01, context_length=10_000, max_running_requests=4)
        tasks = [asyncio.create_task(s.run(1000, 1000, 1000)) for _ in range(2)]
        await asyncio.sleep(0.05)
        mid = s.stats()
        await asyncio.gather(*tasks)
        return mid, s.stats()

    mid, end = asyncio.run(go())
    assert mid.running == 2
    # 2 x (1000 prompt + ~500 decoded) over a 40,000-token pool.
    assert 0.06 < mid.token_usage < 0.09
    assert 0 < mid.generation_tokens_total < 2000 and end.generation_tokens_total == 2000
    assert mid.capacity_tok_s == pytest.approx(350_000.0)
    assert mid.gen_throughput_tok_s > 0
    assert end.token_usage == 0.0


def test_idle_scheduler_has_no_driver_task():
    async def go():
        s = make(time_scale=0.001)
        await s.run(1, 1, 10)
        await asyncio.sleep(0)
        return s._driver

    assert asyncio.run(go()) is None


def test_hundreds_of_concurrent_requests():
    async def go():
        s = make(time_scale=0.001, max_running_requests=48)
        t = time.monotonic()
        await asyncio.gather(*(s.run(100, 100, 2000) for _ in range(400)))
        return time.monotonic() - t, s.stats()

    elapsed, st = asyncio.run(go())
    # 800k tokens at the 3500 tok/s cap = 228.6 sim s = 0.229 wall s (plus prefill, negligible).
    assert 0.22 - SLACK_S <= elapsed < 2.0
    assert st.generation_tokens_total == 800_000 and st.requests_total == 400
