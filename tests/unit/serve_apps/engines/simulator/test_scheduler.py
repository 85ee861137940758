"""Timing model, in-process (no HTTP): wall times follow the continuous-batching arithmetic.

The scheduler runs on a virtual clock (tests/support/virtual_time.py), so the times below
are exact, whatever the machine's load, and the tests take no real time."""

import asyncio
import types

import pytest

from serve_apps.engines.simulator import scheduler as scheduler_module
from serve_apps.engines.simulator.scheduler import RETIRE_SLACK_WALL_S, Scheduler
from tests.support.virtual_time import VirtualClock, run_virtual

# The scheduler retires completions within this much wall time of each other together.
EXACT = RETIRE_SLACK_WALL_S + 1e-9


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> VirtualClock:
    """The scheduler's time.monotonic and the test loop's clock: one virtual clock."""
    clock = VirtualClock()
    monkeypatch.setattr(scheduler_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    return clock


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
    loop = asyncio.get_running_loop()
    t = loop.time()
    await s.run(*args, **kw)
    return loop.time() - t


def test_single_request_decodes_at_per_request_speed(clock):
    async def go():
        s = make(time_scale=0.01)
        return await timed(s, 10, 10, 2000), s.stats()

    elapsed, st = run_virtual(go, clock)
    assert elapsed == pytest.approx(0.2, abs=EXACT)  # 2000 tok / 100 tok/s = 20 sim s = 0.2 wall s
    assert (st.generation_tokens_total, st.prompt_tokens_total, st.requests_total, st.running, st.queued) == (2000, 10, 1, 0, 0)


def test_prefill_time_then_decode(clock):
    async def go():
        s = make(time_scale=0.01, prefill_tok_s=1000.0)
        return await timed(s, 20000, 20000, 100)

    elapsed = run_virtual(go, clock)
    assert elapsed == pytest.approx(0.2 + 0.01, abs=EXACT)  # 20 sim s prefill + 1 sim s decode


def test_aggregate_cap_is_shared(clock):
    async def go():
        s = make(time_scale=0.01, max_decode_tok_s=200.0)
        # 4 requests: each gets min(100, 200/4) = 50 tok/s -> 500 tokens take 10 sim s = 0.1 wall s.
        return await asyncio.gather(*(timed(s, 1, 1, 500) for _ in range(4)))

    for elapsed in run_virtual(go, clock):
        assert elapsed == pytest.approx(0.1, abs=EXACT)  # the cap is shared (unshared: 0.05)


def test_queue_is_fifo_and_bounded_by_max_running(clock):
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

    times, seen = run_virtual(go, clock)
    assert max(r for r, _ in seen) == 2 and max(q for _, q in seen) == 4
    # Three waves of 0.1 s each; FIFO order means later submissions finish later.
    assert times == pytest.approx([0.1, 0.1, 0.2, 0.2, 0.3, 0.3], abs=EXACT)
    assert max(times[:2]) < min(times[2:4]) and max(times[2:4]) < min(times[4:])  # FIFO across waves


def test_slow_requests_take_slow_factor_longer(clock):
    async def go():
        s = make(time_scale=0.02)
        return await asyncio.gather(timed(s, 1, 1, 500), timed(s, 1, 1, 500, slow_factor=4.0))

    fast, slow = run_virtual(go, clock)
    # 500 tokens: 5 sim s = 0.1 wall s; four times slower = 0.4 wall s.
    assert (fast, slow) == pytest.approx((0.1, 0.4), abs=EXACT)


def test_zero_latency_mode_never_waits_but_counts(clock):
    async def go():
        s = make(time_scale=0.0)
        for _ in range(1000):
            await s.run(100, 100, 4096, verify_steps=1366)
        return clock.now, s.stats()

    elapsed, st = run_virtual(go, clock)
    assert elapsed == 0.0  # 4M tokens at 3500 tok/s would be 1170 sim s if it waited
    assert st.generation_tokens_total == 4_096_000 and st.requests_total == 1000 and st.prompt_tokens_total == 100_000
    assert st.capacity_tok_s == 0.0 and st.running == 0
    assert st.spec_accept_length == pytest.approx(4096 / 1366)


def test_cancel_frees_the_slot(clock):
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

    elapsed, st = run_virtual(go, clock)
    # queued 0.02 s behind the hog (10 s wall), then 100 tokens in 0.01 s once it was dropped
    assert elapsed == pytest.approx(0.03, abs=EXACT)
    assert st.running == 0 and st.requests_total == 1


def test_metrics_while_running(clock):
    async def go():
        s = make(time_scale=0.01, context_length=10_000, max_running_requests=4)
        tasks = [asyncio.create_task(s.run(1000, 1000, 1000)) for _ in range(2)]
        await asyncio.sleep(0.05)
        mid = s.stats()
        await asyncio.gather(*tasks)
        return mid, s.stats()

    mid, end = run_virtual(go, clock)
    assert mid.running == 2
    # 2 x (1000 prompt + ~500 decoded) over a 40,000-token pool.
    assert 0.06 < mid.token_usage < 0.09
    assert 0 < mid.generation_tokens_total < 2000 and end.generation_tokens_total == 2000
    assert mid.capacity_tok_s == pytest.approx(350_000.0)
    assert mid.gen_throughput_tok_s > 0
    assert end.token_usage == 0.0


def test_idle_scheduler_has_no_driver_task(clock):
    async def go():
        s = make(time_scale=0.001)
        await s.run(1, 1, 10)
        await asyncio.sleep(0)
        return s._driver

    assert run_virtual(go, clock) is None


def test_hundreds_of_concurrent_requests(clock):
    async def go():
        s = make(time_scale=0.001, max_running_requests=48)
        await asyncio.gather(*(s.run(100, 100, 2000) for _ in range(400)))
        return clock.now, s.stats()

    elapsed, st = run_virtual(go, clock)
    # 8 full waves of 48 share the 3500 tok/s cap; the last 16 run at 100 tok/s each;
    # each of the 9 waves first prefills 100 tokens at 20,000 tok/s.
    sim_s = 8 * 2000 / (3500 / 48) + 2000 / 100 + 9 * 100 / 20000
    assert elapsed == pytest.approx(sim_s * 0.001, abs=EXACT)
    assert st.generation_tokens_total == 800_000 and st.requests_total == 400


def test_idle_seconds_count_only_time_without_work(clock):
    """sglang:scheduler_idle_seconds_total: idle 1 s, busy 0.2 s (one request), idle 0.5 s."""
    async def go():
        s = make(time_scale=0.01)
        await asyncio.sleep(1.0)
        before = s.stats().idle_seconds_total
        await s.run(10, 10, 2000)  # 0.2 wall s of work
        during_and_after = s.stats().idle_seconds_total
        await asyncio.sleep(0.5)
        return before, during_and_after, s.stats().idle_seconds_total

    before, after_run, later = run_virtual(go, clock)
    assert before == pytest.approx(1.0)
    assert after_run == pytest.approx(1.0, abs=EXACT)
    assert later == pytest.approx(1.5, abs=EXACT)


# ---- the KV pool ----------------------------------------------------------------------

def test_without_a_pool_nothing_changes_and_nothing_is_retracted(clock):
    async def go(**kw):
        s = make(time_scale=0.01, **kw)
        times = await asyncio.gather(*(timed(s, 100, 100, 1000 + 100 * i) for i in range(6)))
        return times, s.stats()

    plain, st = run_virtual(go, clock)
    ample, st_ample = run_virtual(lambda: go(max_total_tokens=1_000_000), clock)
    assert ample == pytest.approx(plain, abs=EXACT)
    assert st.retractions_total == st_ample.retractions_total == 0


async def apart(s, n: int, *args, gap_s: float = 0.005, **kw) -> list[asyncio.Task]:
    """``n`` requests ``gap_s`` apart (their tasks): each arrives after the one before it
    was admitted (or left queued), so each is a scheduler pass of its own."""
    tasks = []
    for _ in range(n):
        tasks.append(asyncio.create_task(s.run(*args, **kw)))
        await asyncio.sleep(gap_s)
    return tasks


async def staggered(s, n: int, *args, **kw) -> list:
    """The results of ``apart``'s requests."""
    return await asyncio.gather(*await apart(s, n, *args, **kw))


def test_requests_admitted_together_are_charged_their_whole_budgets(clock):
    """SGLang's PrefillAdder charges a candidate, and every request admitted in the same
    pass, at its whole budget left; only requests of earlier passes count at the ratio.
    Two requests arriving together in a pool that holds one whole budget: one runs, the
    other waits for it to finish (no retraction). Arriving 50 tokens apart, the second is
    admitted beside the first (charged at ~0.65 of its budget) and the two outgrow the
    pool."""
    async def go(gap_s):
        s = make(time_scale=0.01, max_total_tokens=3000, prefill_tok_s=1e6)
        first = asyncio.create_task(s.run(100, 100, 1450, max_new_tokens=1500))
        if gap_s:
            await asyncio.sleep(gap_s)
        second = asyncio.create_task(s.run(100, 100, 1450, max_new_tokens=1500))
        await asyncio.sleep(0.001)
        seen = (s.stats().running, s.stats().queued)
        await asyncio.gather(first, second)
        return seen, s.stats().retractions_total

    assert run_virtual(lambda: go(0.0), clock) == ((1, 1), 0)
    apart, retracted = run_virtual(lambda: go(0.005), clock)
    assert apart == (2, 0) and retracted >= 1


def test_a_pass_stopped_by_the_pool_admits_nothing_until_a_request_leaves(clock):
    """SGLang's batch_is_full: after a request did not fit, no admission is tried until
    one leaves the batch, though the decaying ratio makes room meanwhile. A third request
    (budget 1,000) arriving 50 tokens after the second does not fit at a ratio of ~0.6
    (350 held + 0.6 x 2,850 + 1,100 > 3,000); once the first two have decoded 400 tokens
    it would (ratio ~0.3: 950 + 645 + 1,100), but it waits until the first finishes."""
    async def go():
        s = make(time_scale=0.01, max_total_tokens=3000, prefill_tok_s=1e6)
        first = asyncio.create_task(s.run(100, 100, 1450, max_new_tokens=1500))
        await asyncio.sleep(0.005)
        second = asyncio.create_task(s.run(100, 100, 1450, max_new_tokens=1500))
        await asyncio.sleep(0.005)
        third = asyncio.create_task(s.run(100, 100, 1000, max_new_tokens=1000))
        seen = []
        while not first.done():
            await asyncio.sleep(0.01)
            seen.append((s.stats().running, s.stats().queued))
        await asyncio.gather(second, third)
        return seen[:-1]  # the last: after the first left

    seen = run_virtual(go, clock)
    assert len(seen) >= 10 and set(seen) == {(2, 1)}


def test_a_full_pool_retracts_the_request_with_the_fewest_tokens_and_every_token_counts(clock):
    """Admission at the ratio (0.7, decaying) lets in more than the pool holds at the end;
    decode then retracts, the retracted request re-prefills prompt + output and finishes,
    and the token counters equal the outputs exactly."""
    outputs = [1450, 1450, 1450, 1450]

    async def go():
        s = make(time_scale=0.01, max_total_tokens=3000, prefill_tok_s=1e6)
        results = await staggered(s, len(outputs), 100, 100, outputs[0], max_new_tokens=1500)
        return results, s.stats()

    results, st = run_virtual(go, clock)
    assert st.retractions_total >= 1 and st.last_retracted >= 1
    assert sum(r.retractions for r in results) == st.retractions_total
    assert st.generation_tokens_total == sum(outputs)
    assert st.requests_total == 4 and st.running == st.queued == 0
    assert st.prompt_tokens_total == 400  # a re-prefill is not a new prompt
    assert st.max_total_tokens == 3000


def test_the_pool_is_never_over_full_and_token_usage_is_of_the_pool(clock):
    seen = []

    async def go():
        s = make(time_scale=0.01, max_total_tokens=2000, prefill_tok_s=1e6)
        # apart: requests admitted together never outgrow the pool
        tasks = await apart(s, 5, 200, 200, 850, max_new_tokens=900)
        while not all(t.done() for t in tasks):
            st = s.stats()
            seen.append((st.token_usage, st.running))
            await asyncio.sleep(0.005)
        return s.stats()

    st = run_virtual(go, clock)
    assert max(u for u, _ in seen) <= 1.0 + 1e-9  # held tokens never past the pool
    assert max(u for u, _ in seen) > 0.5 and st.retractions_total >= 1
    assert st.generation_tokens_total == 5 * 850


def test_a_late_wake_up_never_reports_the_pool_past_full(clock):
    """A loaded machine delays the driver's wake-up; a /metrics scrape (stats()) in that
    gap advanced decode past the pool's end before the retraction came: a fresh-clone
    run beside helpers saw sglang:token_usage 1.0046 in test_kv_pool. Here the clock jumps
    with no chance for the driver to run, as a blocked event loop would have it."""
    async def go():
        s = make(time_scale=0.01, max_total_tokens=3000, prefill_tok_s=1e6)
        tasks = await apart(s, 2, 100, 100, 1450, max_new_tokens=1500)
        clock.now += 0.5  # far past the point where the two fill the pool
        late = s.stats()
        await asyncio.gather(*tasks)
        return late, s.stats()

    late, end = run_virtual(go, clock)
    assert late.running == 2 and late.token_usage <= 1.0
    assert end.retractions_total >= 1 and end.generation_tokens_total == 2 * 1450


def test_a_lone_request_larger_than_the_pool_runs_without_retraction(clock):
    async def go():
        s = make(time_scale=0.01, max_total_tokens=500)
        result = await s.run(100, 100, 2000)
        return result, s.stats()

    result, st = run_virtual(go, clock)
    assert result.retractions == 0 and st.retractions_total == 0
    assert st.generation_tokens_total == 2000


def test_admission_reserves_budgets_so_a_large_budget_queues_behind_a_running_one(clock):
    """With 0.7 of both budgets reserved, the second request waits although its prompt
    fits: SGLang's scheduler admits by the room budgets may need, not by prompts."""
    async def go():
        s = make(time_scale=0.01, max_total_tokens=2000, prefill_tok_s=1e6)
        first = asyncio.create_task(s.run(100, 100, 1000, max_new_tokens=1500))
        await asyncio.sleep(0)
        second = asyncio.create_task(s.run(100, 100, 10, max_new_tokens=1500))
        await asyncio.sleep(0.001)
        st = s.stats()
        await asyncio.gather(first, second)
        return st

    st = run_virtual(go, clock)
    assert (st.running, st.queued) == (1, 1)


def test_ignore_eos_requests_reserve_their_whole_budget_and_never_retract(clock):
    """The pool that retracts four budget-bound requests at the ratio (the test above)
    holds the same four as ignore_eos requests without a retraction: SGLang reserves a
    fixed-length request's whole budget (found by the differential against its engine:
    16 ignore_eos requests at a 1,024-token pool, 0 retractions there, 3 here before)."""
    outputs = [1450, 1450, 1450, 1450]

    async def go(ignore_eos):
        s = make(time_scale=0.01, max_total_tokens=3000, prefill_tok_s=1e6)
        await staggered(s, len(outputs), 100, 100, outputs[0], max_new_tokens=1500,
                        ignore_eos=ignore_eos)
        return s.stats()

    fixed = run_virtual(lambda: go(True), clock)
    assert fixed.retractions_total == 0 and fixed.generation_tokens_total == sum(outputs)
    assert run_virtual(lambda: go(False), clock).retractions_total >= 1


def test_a_low_schedule_conservativeness_admits_what_the_default_queues_and_retracts(clock):
    """SGLang's --schedule-conservativeness scales the share of budgets admission reserves
    (0.7 x it): at 0.05 the second request of the test above runs at once, and the two
    outgrow the pool in decode, which then retracts one."""
    async def go(conservativeness):
        s = make(time_scale=0.01, max_total_tokens=2000, prefill_tok_s=1e6,
                 schedule_conservativeness=conservativeness)
        first = asyncio.create_task(s.run(100, 100, 1000, max_new_tokens=1500))
        await asyncio.sleep(0)
        second = asyncio.create_task(s.run(100, 100, 1000, max_new_tokens=1500))
        await asyncio.sleep(0.001)
        st = s.stats()
        await asyncio.gather(first, second)
        return st, s.stats()

    bold, bold_end = run_virtual(lambda: go(0.05), clock)
    assert (bold.running, bold.queued) == (2, 0)
    assert bold_end.retractions_total >= 1 and bold_end.generation_tokens_total == 2000
    default, default_end = run_virtual(lambda: go(1.0), clock)
    assert (default.running, default.queued) == (1, 1)
    assert default_end.retractions_total == 0


def test_an_idle_engine_admits_again_as_boldly_as_at_start_not_at_the_decayed_ratio(clock):
    """The ratio decays while a batch decodes; SGLang resets it when the batch empties.
    A second burst after an idle spell is admitted exactly as the first was."""
    async def burst(s):  # three requests apart: the third fits at a ratio below ~0.14
        tasks = await apart(s, 3, 100, 100, 1000, max_new_tokens=1500)
        seen = (s.stats().running, s.stats().queued)
        await asyncio.gather(*tasks)
        return seen

    async def go():
        s = make(time_scale=0.01, max_total_tokens=3000, prefill_tok_s=1e6)
        first = await burst(s)
        await asyncio.sleep(1.0)
        return first, await burst(s)

    first, second = run_virtual(go, clock)
    assert first == second == (2, 1)
