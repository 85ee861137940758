"""Differential: one request set through the simulator and SGLang's real engine.

The simulator stands in for SGLang in story-scale runs and benchmarks, so every field it
imitates must have the real engine's shape: status codes, error bodies (word for word),
meta_info keys and their JSON types, finish-reason shapes, the /server_info keys raygen
reads, and the /metrics series raygen relays (name, type, label names). Values differ
where the models do (the scripted model and the simulator's length model write other
tokens). Differences kept on purpose are tested as differences (so either side moving
shows), with SGLang's source line (serve_apps/engines/simulator/README.md "Fidelity").
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.simulator_settings import SimulatorSettings
from dashboards.metrics_catalog import SGLANG_SERIES
from serve_apps.engine_client import generate_body, parse_meta
from serve_apps.engines.simulator import tokenizer as tk
from tests.support import sglang_cpu
from tests.support.simulator import SimProcess, http

pytestmark = [pytest.mark.integration]

@pytest.fixture(scope="module")
def sim():
    proc = SimProcess(SimulatorSettings(context_length=sglang_cpu.CONTEXT, time_scale=0.0,
                                        accept_length=0.0, length_median_tokens=30.0,
                                        max_running_requests=16,
                                        enable_strict_thinking=True))  # as the pool
    try:
        proc.wait_listening()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def real(sglang_pool) -> str:
    return sglang_pool.urls[0]


def both(real: str, sim, input_ids: list[int], sampling: dict[str, Any]):
    body = generate_body(input_ids, sampling, rid=f"diff-{time.time_ns()}")
    return (http(real, "/generate", body, timeout=sglang_cpu.REQUEST_TIMEOUT_S),
            http(sim.base, "/generate", body, timeout=sglang_cpu.REQUEST_TIMEOUT_S))


def _types(value: Any) -> Any:
    """The JSON shape of a value: its type names, recursively."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value[:1]]
    return type(value).__name__


def assert_same_shape(real: tuple[int, Any], simulated: tuple[int, Any]) -> None:
    (rs, rb), (ss, sb) = real, simulated
    assert rs == ss == 200, (real, simulated)
    assert set(sb) == set(rb)
    rm, sm = rb["meta_info"], sb["meta_info"]
    assert set(sm) == set(rm), \
        f"only in SGLang: {sorted(set(rm) - set(sm))}; only in the simulator: {sorted(set(sm) - set(rm))}"
    for key in set(sm) & set(rm):
        if rm[key] is not None and sm[key] is not None:
            assert _types(sm[key]) == _types(rm[key]), (key, sm[key], rm[key])
    assert set(sm["finish_reason"]) == set(rm["finish_reason"])
    assert sm["finish_reason"]["type"] == rm["finish_reason"]["type"]
    # what raygen reads from both parses alike
    for out in (parse_meta(rb), parse_meta(sb)):
        assert out.completion_tokens == len(out.output_ids)


CHAT = sglang_cpu.chat_ids("what do the two engines say")


def test_natural_finish(real, sim):
    r, s = both(real, sim, CHAT, {"max_new_tokens": 200, "temperature": 0})
    assert_same_shape(r, s)
    assert r[1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": tk.EOS_ID}


def test_length_finish(real, sim):
    r, s = both(real, sim, CHAT, {"max_new_tokens": 5, "temperature": 0})
    assert_same_shape(r, s)
    assert r[1]["meta_info"]["finish_reason"] == s[1]["meta_info"]["finish_reason"] == \
        {"type": "length", "length": 5}


def test_eos_on_the_last_allowed_token_is_a_stop(real, sim):
    r, _ = both(real, sim, CHAT, {"max_new_tokens": len(sglang_cpu.OUTPUT_IDS), "temperature": 0})
    assert r[1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": tk.EOS_ID}


def _after_think_end(body: dict) -> int:
    ids = body["output_ids"]
    return len(ids) - ids.index(tk.THINK_END_ID)


@pytest.mark.parametrize("budget", [0, 3])
def test_the_thinking_budget_ends_the_thinking_alike(real, sim, budget):
    """Both think budget tokens, then </think> (counted as reasoning), then the answer the
    prompt would have had (as long as without the budget; the models' tokens differ)."""
    sampling = {"max_new_tokens": 200, "temperature": 0}
    free = both(real, sim, CHAT, sampling)
    r, s = both(real, sim, CHAT, dict(sampling, max_thinking_tokens=budget))
    assert_same_shape(r, s)
    for (_, cut), (_, whole) in zip((r, s), free):
        assert whole["meta_info"]["reasoning_tokens"] > budget + 1  # the budget does cut
        assert cut["output_ids"].index(tk.THINK_END_ID) == budget
        assert cut["meta_info"]["reasoning_tokens"] == budget + 1
        assert _after_think_end(cut) == _after_think_end(whole)
        assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": tk.EOS_ID}


def test_stop_string_and_stop_id(real, sim):
    r, s = both(real, sim, CHAT, {"max_new_tokens": 200, "temperature": 0, "stop": ["E"]})
    assert r[1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": "E"}
    assert r[1]["text"].endswith("ABCD")  # trimmed
    r, s = both(real, sim, CHAT, {"max_new_tokens": 200, "temperature": 0,
                                  "stop_token_ids": [tk.THINK_END_ID]})
    assert_same_shape(r, s)
    for _, body in (r, s):
        assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": tk.THINK_END_ID}
        assert body["output_ids"][-1] == tk.THINK_END_ID and "</think>" not in body["text"]


@pytest.mark.parametrize("n_input, max_new", [(300, 1), (256, 1), (250, 7), (250, 6), (251, 1)])
def test_context_refusals_are_the_same_400(real, sim, n_input, max_new):
    r, s = both(real, sim, [tk.WORD_BASE] * n_input, {"max_new_tokens": max_new})
    assert r[0] == 400 and s == r, (r, s)


def test_silent_clamp_is_the_same(real, sim):
    r, s = both(real, sim, [tk.WORD_BASE] * 249, {"max_new_tokens": 7, "ignore_eos": True})
    assert_same_shape(r, s)
    assert r[1]["meta_info"]["finish_reason"] == s[1]["meta_info"]["finish_reason"] == \
        {"type": "length", "length": 5}


@pytest.mark.parametrize("sampling", [
    {"max_new_tokens": 4, "temprature": 1},
    {"max_new_tokens": 4, "temperature": -1},
    {"max_new_tokens": 4, "top_p": 0},
    {"max_new_tokens": 4, "top_k": 0, "temperature": 0.6},
    {"max_new_tokens": 4, "min_p": 2},
    {"max_new_tokens": 4, "presence_penalty": 3.0},
    {"max_new_tokens": 4, "repetition_penalty": 0},
])
def test_error_bodies_are_word_for_word(real, sim, sampling):
    r, s = both(real, sim, CHAT, sampling)
    assert r[0] == 400 and s == r, (r, s)


def test_greedy_sampling_ignores_top_k(real, sim):
    r, s = both(real, sim, CHAT, {"max_new_tokens": 4, "temperature": 0, "top_k": 0})
    assert_same_shape(r, s)


def test_server_info_keys_raygen_reads(real, sim):
    infos = [http(url, "/server_info")[1] for url in (real, sim.base)]
    for info in infos:
        assert info["context_length"] == sglang_cpu.CONTEXT
        assert isinstance(info["max_running_requests"], (int, type(None)))
    assert infos[0]["version"] == "0.5.23"


def _families(url: str) -> dict[str, tuple[str, frozenset[str]]]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("sglang:"):
                out[sample.name] = (family.type, frozenset(sample.labels) - {"le"})
    return out


def test_metrics_raygen_relays_have_the_same_name_type_and_labels(real, sim):
    # SGLang observes inter-token latency from a request's second output chunk on; a
    # non-streamed request is sent in chunks only once it runs long enough (seen here:
    # 8 tokens give no sample, 200 give 150).
    both(real, sim, [tk.WORD_BASE] * 10, {"max_new_tokens": 200, "ignore_eos": True})
    real_series, sim_series = _families(real), _families(sim.base)
    for name in SGLANG_SERIES:
        assert name in real_series, f"{name} not exported by SGLang 0.5.23's engine"
        assert name in sim_series, f"{name} not exported by the simulator"
        assert sim_series[name] == real_series[name], (name, sim_series[name], real_series[name])
    # every series the simulator invents for itself is marked as its own
    invented = set(sim_series) - set(real_series)
    assert all(n.startswith("sglang:sim_") for n in invented), sorted(invented)


def test_cached_tokens_granularity_differs_as_documented(real, sim):
    """A repeated prompt: SGLang (page size 1, mem_cache/radix_cache.py) serves every
    token but the last from its cache; the simulator counts whole 16-token blocks."""
    ids = sglang_cpu.chat_ids(f"granularity {time.time_ns()}")
    for _ in range(2):
        r, s = both(real, sim, ids, {"max_new_tokens": 2})
    assert r[1]["meta_info"]["cached_tokens"] == len(ids) - 1
    assert s[1]["meta_info"]["cached_tokens"] == min(len(ids) // 16 * 16, len(ids) - 1)
