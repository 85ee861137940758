"""Differential tier: the same requests to SGLang 0.5.23's real HTTP stack and to the simulator.

The real stack (fixture ``sglang_stack``, tests/contract/sglang/sglang_stack.py) is
SGLang's own FastAPI app, TokenizerManager and DetokenizerManager, and its scheduler-side
Req finish logic, reasoning counter, input check and budget clamp, fed the simulator's
tokens by a fake scheduler loop. The simulator is the real simulator process. Both get
request bodies built by raygen's own client code (``engine_client.generate_body``) and
must agree on: status, error body, finish reason, output ids and text, meta_info keys
and the values raygen reads, /tokenize, the /server_info keys raygen reads, /metrics
names. Only what the fake scheduler does not model is left out and said so: latencies and
timestamps (wall time), and ``cached_tokens`` (no radix cache in the fake).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from serve_apps.chat_format import render_prompt
from serve_apps.engine_client import EngineClient, KEEPALIVE_S, effective_running_cap, generate_body
from serve_apps.engines.simulator import model as sim_model
from serve_apps.engines.simulator import tokenizer as tk
from contract.simulator_settings import SimulatorSettings
from dashboards.metrics_catalog import SGLANG_SERIES
from tests.support.sglang import ORACLE_CONTEXT, ORACLE_MEDIAN_TOKENS, ORACLE_SIGMA
from tests.support.simulator import SimProcess

REPO = Path(__file__).resolve().parents[3]

# Wall-clock values, and what the fake scheduler does not model (no radix cache).
VOLATILE = {"id", "e2e_latency", "first_token_latency", "request_received_ts",
            "api_server_dispatch_finish_ts", "request_finished_ts",
            "response_sent_to_client_ts", "queue_time", "cached_tokens"}
# Timings SGLang's real scheduler adds under --enable-metrics (the simulator sends them
# too: tests/integration/sglang/test_differential.py); the fake one sets none.
SCHEDULER_TIMINGS = {"storage_prefetch_wait", "storage_staging_wait", "forward_entry_time",
                     "prefill_finished_time", "decode_throughput"}
PARAMS = sim_model.LengthParams(median_tokens=ORACLE_MEDIAN_TOKENS, sigma=ORACLE_SIGMA,
                                accept_length=0.0)


@pytest.fixture(scope="module")
def sim():
    settings = SimulatorSettings(context_length=ORACLE_CONTEXT, time_scale=0.0, accept_length=0.0,
                                 length_median_tokens=ORACLE_MEDIAN_TOKENS,
                                 length_sigma=ORACLE_SIGMA, max_running_requests=48)
    proc = SimProcess(settings)
    try:
        proc.wait_listening()
        yield proc
    finally:
        proc.stop()


def post(base: str, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(base: str, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(base + path, timeout=60) as resp:
        return resp.status, resp.read().decode()


def chat_ids(question: str) -> list[int]:
    """A prompt as raygen renders it (builtin ChatML, thinking on), in the shared id layout."""
    return tk.encode(render_prompt([{"role": "user", "content": question}]))


def both(sglang_stack, sim, input_ids: list[int], sampling: dict[str, Any]):
    body = generate_body(input_ids, sampling, rid=f"diff-{time.time_ns()}")
    return post(sglang_stack.base, "/generate", body), post(sim.base, "/generate", body)


def assert_same_generation(real: tuple[int, Any], simulated: tuple[int, Any]) -> None:
    (rs, rb), (ss, sb) = real, simulated
    assert rs == ss == 200, (real, simulated)
    assert sb["output_ids"] == rb["output_ids"]
    assert sb["text"] == rb["text"]
    rm, sm = rb["meta_info"], {k: v for k, v in sb["meta_info"].items()
                               if k not in SCHEDULER_TIMINGS}
    assert set(sm) == set(rm), f"keys only in SGLang: {set(rm) - set(sm)}; only in sim: {set(sm) - set(rm)}"
    assert {k: v for k, v in sm.items() if k not in VOLATILE} == \
        {k: v for k, v in rm.items() if k not in VOLATILE}


QUESTION = "what is the oracle saying"


def test_natural_finish_reasoning_and_meta_match(sglang_stack, sim):
    ids = chat_ids(QUESTION)
    real, simulated = both(sglang_stack, sim, ids, {"max_new_tokens": 200})
    assert_same_generation(real, simulated)
    meta = real[1]["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": tk.EOS_ID}
    # require_reasoning (sent by raygen) makes SGLang count; the prompt opened <think>.
    assert 0 < meta["reasoning_tokens"] < meta["completion_tokens"]


def test_length_finish_matches(sglang_stack, sim):
    real, simulated = both(sglang_stack, sim, chat_ids(QUESTION), {"max_new_tokens": 5})
    assert_same_generation(real, simulated)
    assert real[1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_eos_on_the_last_allowed_token_is_a_stop(sglang_stack, sim):
    ids = chat_ids(QUESTION)
    natural = sim_model.natural_output_length(ids, PARAMS)
    real, simulated = both(sglang_stack, sim, ids, {"max_new_tokens": natural})
    assert_same_generation(real, simulated)
    assert real[1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": tk.EOS_ID}


@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_stop_string_finish_matches(sglang_stack, sim, no_stop_trim):
    ids = chat_ids(QUESTION)
    words = sim_model.generate(ids, PARAMS, 200).text.split()
    stop = " " + words[3]  # a word the output really contains
    real, simulated = both(sglang_stack, sim, ids, {"max_new_tokens": 200, "stop": [stop],
                                                     "no_stop_trim": no_stop_trim})
    assert_same_generation(real, simulated)
    assert real[1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_stop_token_and_ignore_eos_match(sglang_stack, sim):
    ids = chat_ids(QUESTION)
    real, simulated = both(sglang_stack, sim, ids, {"max_new_tokens": 200,
                                                     "stop_token_ids": [tk.THINK_END_ID]})
    assert_same_generation(real, simulated)
    assert real[1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": tk.THINK_END_ID}
    real, simulated = both(sglang_stack, sim, ids, {"max_new_tokens": 60, "ignore_eos": True})
    assert_same_generation(real, simulated)
    assert real[1]["meta_info"]["finish_reason"] == {"type": "length", "length": 60}


# Context edges (context 1000): the tokenizer manager's two checks, the scheduler's input
# check at context - 6, and its silent clamp to context - input - 2.
@pytest.mark.parametrize("n_input, max_new, expect", [
    (990, 20, 400),    # input + max_new > context (tokenizer manager)
    (1000, 1, 400),    # input >= context (tokenizer manager)
    (994, 1, 400),     # input >= context - 6 (scheduler)
    (995, 1, 400),
    (993, 1, 200),     # the longest prompt SGLang accepts
    (990, 10, 200),    # accepted, then clamped to 8
])
def test_context_edges_match(sglang_stack, sim, n_input, max_new, expect):
    ids = [tk.BYTE_BASE + 97] * n_input
    real, simulated = both(sglang_stack, sim, ids, {"max_new_tokens": max_new, "ignore_eos": True})
    assert real[0] == expect, real
    if expect == 200:
        assert_same_generation(real, simulated)
    else:
        assert simulated == real


def test_scheduler_clamp_is_context_minus_input_minus_two(sglang_stack, sim):
    ids = [tk.BYTE_BASE + 97] * 990
    real, _ = both(sglang_stack, sim, ids, {"max_new_tokens": 10, "ignore_eos": True})
    assert real[1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}


@pytest.mark.parametrize("sampling", [
    {"max_new_tokens": 4, "temprature": 1},           # contract: {"error": "unknown field ..."}
    {"max_new_tokens": 4, "temperature": -1},
    {"max_new_tokens": 4, "temperature": -1.5},
    {"max_new_tokens": 4, "top_p": 0},
    {"max_new_tokens": 4, "top_k": 0},
    {"max_new_tokens": 4, "min_p": 2},
    {"max_new_tokens": 4, "frequency_penalty": 3},
    {"max_new_tokens": 4, "repetition_penalty": 0},
    {"max_new_tokens": 2, "min_new_tokens": 3},
    {"max_new_tokens": 4, "sampling_seed": 2**63},   # raygen's seeds are in [0, 2**63)
    {"max_new_tokens": 4, "sampling_seed": 1.5},
])
def test_error_bodies_match(sglang_stack, sim, sampling):
    real, simulated = both(sglang_stack, sim, chat_ids(QUESTION), sampling)
    assert real[0] == 400, real
    assert simulated == real


@pytest.mark.parametrize("budget, status", [(5, 400), (-1, 400)])
def test_a_thinking_budget_without_strict_thinking_is_the_same_400(sglang_stack, sim, budget,
                                                                   status):
    """The stack runs without --enable-strict-thinking, as the simulator by default: its
    tokenizer manager refuses max_thinking_tokens; a negative one fails its contract."""
    real, simulated = both(sglang_stack, sim, chat_ids(QUESTION),
                           {"max_new_tokens": 4, "max_thinking_tokens": budget})
    assert real[0] == status and simulated == real, (real, simulated)
    expect = ("requires the server to be launched with --enable-strict-thinking" if budget >= 0
              else "invalid value: integer `-1`, expected u64")
    assert expect in json.dumps(real[1])


@pytest.mark.parametrize("top_k", [0, -5])
def test_greedy_sampling_ignores_top_k_in_both(sglang_stack, sim, top_k):
    """temperature 0 is greedy: SGLang sets top_k = 1 before it checks the range
    (SamplingParams.__post_init__), so a top_k it refuses otherwise passes."""
    real, simulated = both(sglang_stack, sim, chat_ids(QUESTION),
                           {"max_new_tokens": 4, "temperature": 0, "top_k": top_k})
    assert_same_generation(real, simulated)


def test_tokenize_matches(sglang_stack, sim):
    body = {"prompt": render_prompt([{"role": "user", "content": "é 漢 hi"}]),
            "add_special_tokens": False}
    assert post(sim.base, "/tokenize", body) == post(sglang_stack.base, "/tokenize", body)


def test_server_info_keys_raygen_reads(sglang_stack, sim):
    real = json.loads(get(sglang_stack.base, "/server_info")[1])
    simulated = json.loads(get(sim.base, "/server_info")[1])
    for info in (real, simulated):
        assert info["context_length"] == ORACLE_CONTEXT   # jobs/runs/run.py engine_context_length
        assert effective_running_cap(info) == 48           # the replica's reported cap
    assert real["version"] == "0.5.23"


def test_metrics_names_raygen_relays(sglang_stack, sim):
    """The SGLang series raygen's dashboard reads exist, under those names, in both.
    Labelled histograms have no samples before a first request: send one."""
    both(sglang_stack, sim, chat_ids(QUESTION), {"max_new_tokens": 8})

    def names(text: str) -> set[str]:
        return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
                if line.startswith("sglang:")}
    real, simulated = names(get(sglang_stack.base, "/metrics")[1]), names(get(sim.base, "/metrics")[1])
    relayed = set(SGLANG_SERIES)  # what raygen's dashboard reads
    # ITL is observed from a request's second output chunk on
    # (sglang/srt/managers/tokenizer_manager.py, collect_metrics); the fake scheduler
    # sends each request's tokens in one chunk, so the real stack has no ITL sample.
    assert relayed - {"sglang:inter_token_latency_seconds_bucket"} <= real, relayed - real
    assert relayed <= simulated, relayed - simulated


def test_engine_client_reads_both_alike(sglang_stack, sim):
    """raygen's EngineClient end to end: the same EngineOutput from both servers."""
    async def run(base: str):
        client = EngineClient(base, request_timeout_s=60)
        try:
            return await client.generate(chat_ids(QUESTION), {"max_new_tokens": 200}, rid="same")
        finally:
            await client.close()
    real, simulated = asyncio.run(run(sglang_stack.base)), asyncio.run(run(sim.base))
    volatile = {"e2e_latency_s", "cached_tokens"}
    assert {k: v for k, v in vars(real).items() if k not in volatile} == \
        {k: v for k, v in vars(simulated).items() if k not in volatile}
    assert real.reasoning_tokens and real.num_retractions == 0


def test_engine_client_survives_uvicorn_keepalive_closes(sglang_stack):
    """uvicorn (SGLang's 5 s keep-alive) closes idle connections; no call may fail for it.
    One client per idle gap, side by side: each gap is tested on its own connection."""
    async def call_idle_call(gap_s: float):
        client = EngineClient(sglang_stack.base, request_timeout_s=60)
        try:
            rid = f"k-{gap_s}"  # requests in flight at once need their own ids
            first = await client.generate(chat_ids(QUESTION), {"max_new_tokens": 4}, rid)
            await asyncio.sleep(gap_s)  # idle longer than the server keeps a connection
            return first, await client.generate(chat_ids(QUESTION), {"max_new_tokens": 4}, rid)
        finally:
            await client.close()

    async def run():
        return await asyncio.gather(*(call_idle_call(gap_s) for gap_s in (5.2, 5.5, 6.0)))
    outs = [out for pair in asyncio.run(run()) for out in pair]
    assert [o.finish_reason for o in outs] == ["length"] * 6
    assert KEEPALIVE_S < 5.0


# The speculative fixtures were recorded from a stack started with NEXTN (regen script);
# the session stack runs without, so only the others are re-sent here. The speculative
# ones are parsed by raygen's client in test_sglang_contract.py.
FIXTURES = sorted(p for p in (REPO / "tests" / "fixtures" / "sglang").glob("sglang-0.5.23_*.json")
                  if not json.loads(p.read_text())["speculative"])


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_recorded_fixtures_are_what_the_stack_answers(sglang_stack, sim, path):
    """The 0.5.23 fixtures were recorded from this stack (regen_sglang_fixtures.py); the
    non-speculative ones are re-sent each run, to SGLang's stack and to the simulator."""
    fixture = json.loads(path.read_text())
    assert fixture["_source"].startswith("sglang 0.5.23 ") and "request" in fixture
    recorded = fixture["response"]
    real = post(sglang_stack.base, "/generate", fixture["request"])
    assert_same_generation(real, (200, recorded))
    assert_same_generation(real, post(sim.base, "/generate", fixture["request"]))
