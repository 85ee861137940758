"""raygen tune's choice (jobs/tune/recommend.py), the figures of a point
(jobs/tune/measure.point_figures) and the sweep's plan and refusals (jobs/tune/plan.py)."""

from __future__ import annotations

import asyncio

import pytest

from contract.protocol import GenerateResult
from jobs.config import parse_config
from jobs.tune import recommend as R
from jobs.tune.measure import (GEN, QUEUED, RETRACTED, RUNNING, USAGE, Finished, Load, Point,
                               metric_sums, point_figures)
from jobs.tune.plan import TuneRefused, default_concurrencies, parse_counts, plan


def point(concurrency, tok_s, retracted=0, rows=50, cap=48, usage_max=0.5) -> Point:
    return Point(cap=cap, concurrency=concurrency, window_s=10.0, output_tok_s=tok_s,
                 running=min(concurrency, cap), queued=0.0, token_usage=usage_max * 0.8,
                 token_usage_max=usage_max, retractions=retracted, rows=rows, failed=0,
                 accept_length=3.0)


# A pool that binds: throughput rises with the requests at once until the pool retracts.
POOL_BOUND = [point(12, 20_000), point(24, 30_000), point(48, 36_000, retracted=28),
              point(96, 36_500, retracted=16)]


def test_the_best_point_that_does_not_retract_and_what_it_means_for_the_config():
    rec = R.recommend(POOL_BOUND, replicas=8, actors=2, gpus_per_engine=1)
    assert rec.point is POOL_BOUND[1] and (rec.cap, rec.rows_in_flight) == (24, 30)
    # 30 rows per engine x 8 replicas over 2 actors; Serve admits twice a replica's share
    assert rec.overrides == ["engine.max_running_requests=24",
                             "job.inflight_rows_per_actor=120", "serve.max_ongoing_requests=60"]
    assert any("retracted at 48 requests at once" in n for n in rec.notes)  # 96 ran 48
    assert any("between 24 (clean) and 48 (retracted): narrow it with --concurrency "
               "24,30,36,42,48" in n for n in rec.notes)


def test_a_point_above_one_that_retracted_is_not_clean_even_with_no_retraction_of_its_own():
    lucky = [point(4, 6_000), point(16, 15_600, retracted=3, rows=61),
             point(32, 15_750, retracted=0, rows=64)]
    rec = R.recommend(lucky, replicas=2, actors=2)
    assert rec.point is lucky[0] and rec.cap == 4
    assert [p["clean"] for p in R.to_json(lucky, rec, None)["points"]] == [True, False, False]


def test_the_recommended_settings_pass_the_config_check():
    rec = R.recommend(POOL_BOUND, replicas=2, actors=2)
    tree = {"engine": {"kind": "simulator", "model_path": "sim-x"},
            "job": {"input": "x", "output": "y", "run_name": "r"},
            "serve": {"autoscaling": {"min_replicas": 2, "max_replicas": 2}}}
    for override in rec.overrides:
        key, value = override.split("=")
        section, name = key.split(".")
        tree[section][name] = int(value)
    cfg = parse_config(tree)
    assert cfg.engine.max_running_requests == 24


def test_within_three_percent_the_fewest_requests_at_once_win():
    flat = [point(24, 30_000), point(48, 30_600), point(96, 30_800)]
    rec = R.recommend(flat, replicas=1, actors=1)
    assert rec.cap == 24  # the same throughput with room left in the pool


def test_still_rising_at_the_top_says_to_sweep_larger_caps():
    rising = [point(12, 10_000), point(24, 20_000), point(48, 38_000), point(96, 40_000)]
    rec = R.recommend(rising, replicas=1, actors=1)
    assert rec.cap == 48  # 96 queued above the cap: the engine ran 48
    assert any("still rising at the most requests swept (48)" in n and "--caps 48,96" in n
               for n in rec.notes)


def test_an_engine_whose_pool_admits_fewer_than_asked_is_said_so_not_rising():
    """SGLang's CPU engine with a 2,048-token pool at budget 256 ran ~2.7 of 16 asked
    (the rest queued): the pool's admission bound it, so no 'sweep larger caps'."""
    pts = [point(2, 211), point(8, 272), point(16, 298)]
    for p, running, queued in zip(pts, (1.9, 2.7, 2.7), (0.0, 5.0, 13.1)):
        p.running, p.queued = running, queued
    rec = R.recommend(pts, replicas=2, actors=1)
    assert rec.cap == 16
    assert any("ran 2.7 requests at once there with 13.1 queued: its KV pool's admission "
               "bound the batch" in n for n in rec.notes)
    assert not any("still rising" in n for n in rec.notes)


def test_a_few_retractions_among_many_rows_are_tolerated_but_not_among_few():
    assert R.clean(point(48, 1.0, retracted=1, rows=150))
    assert not R.clean(point(48, 1.0, retracted=1, rows=50))
    assert not R.clean(point(48, 0.0))  # generated nothing


def test_when_every_point_retracts_nothing_is_recommended_and_the_fix_is_named():
    rec = R.recommend([point(12, 9_000, retracted=5), point(24, 9_500, retracted=9)], 1, 1)
    assert rec.point is None and rec.cap is None
    assert "even 12 requests at once outgrow the engine's KV pool" in rec.notes[0]
    assert R.describe(rec, 1, 1, 1)[0] == "recommended: nothing (see below)"


def test_a_full_pool_at_the_chosen_point_is_a_warning():
    rec = R.recommend([point(12, 9_000, usage_max=0.97)], 1, 1)
    assert any("filled the KV pool to 97%" in n for n in rec.notes)


def test_per_gpu_figures_and_engine_hours():
    p = point(24, 3600.0)
    assert R.gpu_hours_per_1b(R.per_gpu(p, 1)) == pytest.approx(1e9 / (3600 * 3600))
    lines = R.table([p], 0, p)
    assert "out tok/s/engine" in lines[0] and "engine-h/1B tok" in lines[0]
    assert lines[1].endswith("<- recommended")
    assert "out tok/s/GPU" in R.table([p], 1)[0]
    out = R.to_json([p], R.recommend([p], 1, 1, 1), 1)
    assert out["recommended"]["max_running_requests"] == 24
    assert out["points"][0]["gpu_hours_per_1b_output_tokens"] == pytest.approx(77.16, abs=0.01)


def test_point_figures_from_the_engines_counters_and_the_rows_finished_in_its_window():
    start = (10.0, {GEN: 1000.0, USAGE: 0.5, RUNNING: 10, QUEUED: 2})
    scrapes = [(12.0, {GEN: 3000.0, USAGE: 0.7, RUNNING: 12, QUEUED: 0, RETRACTED: 1.0}),
               (14.0, {GEN: 5000.0, USAGE: 0.9, RUNNING: 14, QUEUED: 4, RETRACTED: 3.0})]
    finished = [Finished(9.0, 500, 100, None),     # before the window: not counted
                Finished(11.0, 401, 100, None), Finished(13.0, 301, None, None),
                Finished(13.5, 0, None, "context_overflow: too long")]
    p = point_figures(48, 16, start, scrapes[-1], scrapes, finished)
    assert p.output_tok_s == 1000.0  # 4,000 tokens over 4 s
    assert p.retractions == 3  # the counter appeared after the window opened: from 0
    assert (p.running, p.queued, p.token_usage_max) == (13.0, 2.0, 0.9)
    assert p.token_usage == pytest.approx(0.8)
    assert (p.rows, p.failed) == (3, 1) and p.first_error.startswith("context_overflow")
    assert p.accept_length == 4.0  # (401 - 1) tokens over 100 verify steps
    # retractions count from the scrape taken as the concurrency was raised: 2 in the
    # settle (the counter at 2 when the window opens) and 1 in the window, 3; tok/s and
    # rows stay the window's
    start = (10.0, {GEN: 1000.0, RETRACTED: 2.0})
    assert point_figures(48, 16, start, scrapes[-1], scrapes, finished).retractions == 1
    whole = point_figures(48, 16, start, scrapes[-1], scrapes, finished, raised={GEN: 500.0})
    assert whole.retractions == 3 and whole.output_tok_s == 1000.0 and whole.rows == 3


def test_metric_sums_adds_label_sets_and_drops_created():
    text = ('# TYPE sglang:generation_tokens counter\n'
            'sglang:generation_tokens_total{model_name="m",tp_rank="0"} 5\n'
            'sglang:generation_tokens_total{model_name="m",tp_rank="1"} 7\n'
            'sglang:generation_tokens_created{model_name="m"} 1.7e9\n')
    assert metric_sums(text) == {GEN: 12.0}


def test_the_closed_loop_keeps_each_worker_to_one_request():
    async def main():
        in_flight, peak, sent = [0], [0], []

        async def send(request):
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            sent.append(request.key)
            await asyncio.sleep(0.01)
            in_flight[0] -= 1
            return GenerateResult(key=request.key, completion_tokens=7, spec_verify_ct=2)

        from contract.protocol import GenerateRequest
        load = Load(send, lambda i: GenerateRequest(f"k{i}", "r", "c", 8, {}))
        load.raise_to(3)
        await asyncio.sleep(0.1)
        assert peak[0] == 3 and load.dead_worker() is None
        load.raise_to(5)
        await asyncio.sleep(0.1)
        await load.close()
        return peak[0], sent, load.finished
    peak, sent, finished = asyncio.run(main())
    assert peak == 5 and len(set(sent)) == len(sent)  # each request a new prompt index
    assert finished and all(f.tokens == 7 for f in finished)


def cfg_of(**engine):
    return parse_config({"engine": {"kind": "simulator", "model_path": "sim-x",
                                    "max_running_requests": 48, **engine},
                         "job": {"input": "x", "output": "y", "run_name": "r"}})


def test_the_plan_and_its_refusals():
    sweep = plan(cfg_of(), point_s=30)
    assert sweep.caps == (48,) and sweep.concurrencies == (12, 24, 48, 96)
    assert default_concurrencies(1) == (1, 2) and default_concurrencies(3) == (1, 3, 6)
    assert "4 points: caps 48 x concurrency 12, 24, 48, 96, 30 s each (~2.0 min" in sweep.describe()
    assert plan(cfg_of(), caps=[32, 16], concurrencies=[8]).caps == (16, 32)
    assert parse_counts("16, 8,16", "--caps") == (8, 16)
    for text in ("8,x", "0,4", ""):
        with pytest.raises(TuneRefused, match="--caps"):
            parse_counts(text, "--caps")
    with pytest.raises(TuneRefused, match="time_scale is 0"):
        plan(cfg_of(simulator={"time_scale": 0}))
    with pytest.raises(TuneRefused, match="at least 2 s"):
        plan(cfg_of(), point_s=1)
    with pytest.raises(TuneRefused, match="more than 24"):
        plan(cfg_of(), caps=list(range(1, 8)), concurrencies=[1, 2, 3, 4])


def test_a_cap_the_engine_section_cannot_run_is_refused_naming_the_key():
    cfg = parse_config({"engine": {"kind": "sglang", "model_path": "m", "device": "cuda",
                                   "max_running_requests": 16, "max_mamba_cache_size": 80},
                        "job": {"input": "x", "output": "y", "run_name": "r"}})
    assert plan(cfg, caps=[16]).caps == (16,)
    with pytest.raises(TuneRefused, match=r"cap 32: engine.*max_mamba_cache_size \(80\) caps "
                                          r"running requests at 16"):
        plan(cfg, caps=[16, 32])
