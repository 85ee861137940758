"""Timing, batching, faults and process lifecycle of the real simulator process."""

import os
import signal
import threading
import time
import urllib.error

import pytest

from serve_apps.engines.simulator import tokenizer as tk
from tests.support.waiting import wait_until



def test_continuous_batching_limits_running_and_queues(sim_factory):
    # One request = 100 tokens at 100 tok/s = 1 sim s = 0.4 wall s; 6 requests on 2 slots = 3 waves.
    sim = sim_factory(max_running_requests=2, time_scale=0.4, accept_length=0)
    results: list = [None] * 6
    sent = [0.0] * 6

    def fire(i: int) -> None:
        sent[i] = time.monotonic()
        results[i] = sim.call("/generate", {"text": f"job {i}", "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}})

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    running, queued = [], []
    while any(t.is_alive() for t in threads):
        mtr = sim.metrics()
        running.append(mtr["sglang:num_running_reqs"])
        queued.append(mtr["sglang:num_queue_reqs"])
        time.sleep(0.03)
    for t in threads:
        t.join()
    assert max(running) == 2 and max(queued) > 0
    assert all(status == 200 for status, _ in results)
    # three waves of 0.4 s, by the simulator's own clock; that clock starts when a request
    # arrives, so one sent after the first wave began waits that much less (a loaded
    # machine starts the six threads tens of ms apart); two waves would end at 0.8 s
    latencies = sorted(body["meta_info"]["e2e_latency"] for _, body in results)
    stagger = max(sent) - min(sent)
    assert latencies[-1] >= 1.2 - stagger - 0.05 and latencies[0] >= 0.4 - 0.01
    assert all("spec_verify_ct" not in body["meta_info"] for _, body in results)  # accept_length 0: spec off
    final = sim.metrics()
    assert final["sglang:num_running_reqs"] == 0 and final["sglang:num_queue_reqs"] == 0
    assert final["sglang:generation_tokens_total"] == 600
    assert final["sglang:sim_capacity_tok_s"] == pytest.approx(3500 / 0.4)
    assert final["sglang:gen_throughput"] > 0


def test_latency_follows_decode_speed_and_prefill(sim_factory):
    sim = sim_factory(time_scale=0.005, prefill_tok_s=1000.0)
    # 2000 tokens at 100 tok/s = 20 sim s; 1000 prompt tokens at 1000 tok/s = 1 sim s -> 0.105 wall s.
    ids = [tk.BYTE_BASE + 98] * 1000
    status, body = sim.call("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}})
    assert status == 200
    assert 0.104 <= body["meta_info"]["e2e_latency"] < 1.0
    # Same prompt again: its prefix is cached, so prefill is shorter and cached_tokens reported.
    status, body = sim.call("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 10}})
    assert body["meta_info"]["cached_tokens"] == 992  # whole 16-token blocks of the 1000-token prompt
    # SGLang's per-request series (relayed by raygen's replicas to its dashboard).
    m = sim.metrics()
    assert m["sglang:time_to_first_token_seconds_count"] == 2
    assert m["sglang:inter_token_latency_seconds_count"] == 2
    # First request: 1 sim s of prefill = 5 ms wall; decode 20 sim s = 0.1 s over 1999 intervals.
    assert m["sglang:time_to_first_token_seconds_sum"] >= 0.005 - 1e-4
    assert m["sglang:inter_token_latency_seconds_sum"] >= 0.1 / 1999 - 1e-6
    assert m["sglang:cache_hit_rate"] == pytest.approx(992 / 2000)
    assert m["sglang:num_retracted_reqs"] == 0


def test_zero_latency_mode_is_fast(sim_fast):
    # 8000 tokens would take 80 s at time_scale 1; zero-latency answers as fast as it can compute.
    for i in range(5):
        status, body = sim_fast.call("/generate", {"text": f"quick {i}", "sampling_params": {"max_new_tokens": 8000, "ignore_eos": True}})
        assert status == 200 and body["meta_info"]["completion_tokens"] == 8000
        assert body["meta_info"]["e2e_latency"] < 2.0


def test_error_rate_gives_500s_and_clearing_restores_200s(sim_factory):
    sim = sim_factory(time_scale=0.0)
    status, faults = sim.call("/sim/faults", {"error_rate": 1.0})
    assert status == 200 and faults["error_rate"] == 1.0 and faults["error_status"] == 500
    for _ in range(5):
        status, body = sim.call("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}})
        assert status == 500
        assert set(body) == {"error"} and "error_rate" in body["error"]["message"]
    # Validation still comes first: a bad request stays a 400.
    assert sim.call("/generate", {"text": "x", "sampling_params": {"bogus": 1}})[0] == 400
    sim.call("/sim/faults", {"error_rate": 0.5, "error_status": 503})
    statuses = {sim.call("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}})[0] for _ in range(40)}
    assert statuses == {200, 503}  # random per request, so a retry can succeed
    status, faults = sim.call("/sim/faults", {"error_rate": 0.0})
    assert faults["error_rate"] == 0.0
    assert all(sim.call("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}})[0] == 200 for _ in range(5))


def test_slow_rate_makes_requests_slower(sim_factory):
    sim = sim_factory(time_scale=0.01, slow_rate=1.0, slow_factor=5.0)
    # 500 tokens at 100/5 tok/s = 25 sim s = 0.25 wall s (vs 0.05 when fast).
    body = {"text": "slow", "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
    assert sim.call("/generate", body)[1]["meta_info"]["e2e_latency"] >= 0.25
    sim.call("/sim/faults", {"slow_rate": 0.0})
    assert 0.05 <= sim.call("/generate", body)[1]["meta_info"]["e2e_latency"] < 0.25


def test_crash_after_requests_kills_the_process(sim_factory):
    sim = sim_factory(time_scale=0.0, crash_after_requests=3)
    for _ in range(2):
        assert sim.call("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}})[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        sim.call("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}}, timeout=10)
    assert sim.proc.wait(timeout=10) == 1
    assert "simulated crash after 3" in sim.output()


def test_crash_can_be_armed_at_runtime(sim_factory):
    sim = sim_factory(time_scale=0.0)
    for _ in range(5):
        sim.call("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}})
    status, faults = sim.call("/sim/faults", {"crash_after_requests": 2})  # counts from now
    assert status == 200 and faults["crash_after_requests"] == 2
    assert sim.call("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}})[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        sim.call("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}}, timeout=10)
    assert sim.proc.wait(timeout=10) == 1


def test_health_is_503_during_startup_then_sigterm_exits_0(sim_factory):
    sim = sim_factory(require_ready=False, startup_s=1.0, time_scale=0.0)
    assert "simulator ready on http://127.0.0.1:" in sim.output()
    assert sim.call("/health")[0] == 503
    assert sim.call("/health_generate")[0] == 503
    status, body = sim.call("/generate", {"text": "early"})
    assert status == 503 and "starting up" in body["error"]["message"]
    sim.wait_listening(require_ready=True)
    assert time.monotonic() - sim.started_at >= 1.0
    assert sim.call("/generate", {"text": "now"})[0] == 200
    os.kill(sim.proc.pid, signal.SIGTERM)
    assert sim.proc.wait(timeout=10) == 0


def test_sigterm_with_requests_in_flight_exits_0_promptly(sim_factory):
    sim = sim_factory(time_scale=1.0)  # a 1000-token request would take 10 s
    errors = []

    def fire() -> None:
        try:
            errors.append(sim.call("/generate", {"text": "long", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}))
        except OSError as e:  # the connection is dropped at shutdown
            errors.append(e)

    thread = threading.Thread(target=fire)
    thread.start()
    wait_until(lambda: sim.metrics()["sglang:num_running_reqs"] >= 1, 5,
               "the request to run")
    os.kill(sim.proc.pid, signal.SIGTERM)
    assert sim.proc.wait(timeout=10) == 0
    thread.join(timeout=10)
    # promptly: the 10 s request was cut off, not answered
    assert errors and not (isinstance(errors[0], tuple) and errors[0][0] == 200)


def test_a_kv_pool_that_binds_retracts_and_says_so_as_sglang_does(sim_factory):
    """max_total_tokens small enough that six 300-token budgets cannot all run: the
    scheduler admits at its reserve ratio, decode retracts, every request still finishes
    with its whole output; meta_info num_retractions, sglang:num_retracted_reqs,
    token_usage of the pool and /server_info max_total_tokens say what happened."""
    # 0.5 wall s per simulated s: a request decodes for 1.5 s and the pool binds ~1.2 s
    # after four are in, so requests a loaded machine sends a few hundred ms apart still
    # overlap (at 0.01 they finished before the next arrived and nothing was retracted)
    # Budget-bound without ignore_eos (which SGLang reserves in full, never retracting):
    # the length model's outputs all run past 300 tokens.
    sim = sim_factory(max_running_requests=8, max_total_tokens=1200, time_scale=0.5,
                      accept_length=0, length_median_tokens=5000.0, length_sigma=0.1)
    results: list = [None] * 6
    usage: list = []
    began = time.monotonic()

    def fire(i: int) -> None:
        # 0.1 s apart, each a scheduler pass of its own: as SGLang's, the simulator charges
        # the requests of one pass their whole budgets, so six arriving at once never retract
        time.sleep(max(0.0, began + 0.1 * i - time.monotonic()))
        results[i] = sim.call("/generate", {"text": f"job {i} " * 20, "sampling_params": {
            "max_new_tokens": 300}})

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        usage.append(sim.metrics()["sglang:token_usage"])
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert all(status == 200 for status, _ in results)
    assert all(body["meta_info"]["completion_tokens"] == 300 for _, body in results)
    retractions = sum(body["meta_info"]["num_retractions"] for _, body in results)
    assert retractions >= 1
    final = sim.metrics()
    assert final["sglang:num_retracted_reqs"] >= 1
    assert final["sglang:num_retracted_requests_total"] == retractions
    assert final["sglang:generation_tokens_total"] == 6 * 300
    assert 0.5 < max(usage) <= 1.0
    assert sim.call("/server_info")[1]["max_total_tokens"] == 1200
