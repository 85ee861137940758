"""SGLang 0.5.23's real engine on this CPU (``engine.device: cpu``), for the tests of
what only SGLang decides: the engine section they run, and what the scripted model
(serve_apps/engines/sglang_cpu/models.py) must produce.
"""

from __future__ import annotations

from typing import Any, Optional

from serve_apps.chat_format import render_prompt
from serve_apps.engines.sglang_cpu import models
from serve_apps.engines.simulator import tokenizer as tk

CONTEXT = 256              # small, so every context boundary is cheap to reach
APP = "raygen-sglang"      # the Serve app of the shared pool (tests/integration/sglang/)
SPEC_APP = "raygen-sglang-spec"  # its one speculative engine (the same folder)
SPEC_ROWS = 6  # the speculative pool's run (tests/integration/sglang/conftest.py spec_run)
# One more engine of the scripted model whose KV pool is too small for the rows it is given
# (the same folder): the smoke's capacity and retraction checks fail on it, and the
# simulator's pool is compared with SGLang's retractions on it.
SMALL_POOL_APP = "raygen-sglang-small-pool"
SMALL_POOL_TOKENS = 1024
# SGLang's new-token ratio starts at 0.7 x this (0.035): admission reserves little of a
# request's budget, so requests decoding past what was reserved make the scheduler retract.
SMALL_POOL_CONSERVATIVENESS = 0.05
# What SGLang's CPU engine runs with raygen's shims: a STANDALONE chain of one draft token
# (topk 1: SGLang resolves num_draft_tokens to steps + 1 = 2).
SPECULATIVE = {"algorithm": "STANDALONE", "num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 2}
SERVED_NAME = "tiny-scripted"
# An engine start: ~25 s idle. Beside a CPU-bound process and the suite (load ~40 on 2
# cores) a replacement engine had not answered /health after 300 s, and each retry Serve
# made started it again from nothing (test_replica_loss waited 600 s for one that never came).
START_TIMEOUT_S = 900

# A chat prompt ends in "<think>\n": the scripted model thinks a..z, closes, answers A..J.
REASONING = "abcdefghijklmnopqrstuvwxyz"
ANSWER = "ABCDEFGHIJ"
TEXT = f"{REASONING}</think>{ANSWER}"
OUTPUT_IDS = ([models.byte_id(c) for c in REASONING] + [tk.THINK_END_ID]
              + [models.byte_id(c) for c in ANSWER] + [tk.EOS_ID])
REASONING_TOKENS = len(REASONING) + 1  # SGLang counts the </think> as reasoning


def engine_section(model_path: str, **overrides: Any) -> dict[str, Any]:
    """The engine section of the shared pool: the scripted model on SGLang's CPU engine,
    with strict thinking (so a run may set job.sampling.max_thinking_tokens; the scripted
    model never ends while thinking, so EOS masked there changes none of its outputs).
    ``extra_args`` in ``overrides`` are added to the pool's."""
    extra = {"enable-strict-thinking": True, **overrides.pop("extra_args", {})}
    return {"kind": "sglang", "device": "cpu", "model_path": model_path,
            "served_model_name": SERVED_NAME, "chat_template": "builtin",
            "reasoning_parser": "qwen3", "context_length": CONTEXT,
            "max_total_tokens": 16384, "max_running_requests": 16,
            "start_timeout_s": START_TIMEOUT_S, "request_timeout_s": 120,
            "extra_args": extra, **overrides}


def spec_engine_section(model_path: str, draft_path: str, **overrides: Any) -> dict[str, Any]:
    """The speculative engine: the pool's section with the ``draft`` model drafting for
    the scripted one (it guesses every thinking token wrong and the answer right), and
    metrics on (sglang:spec_accept_length is relayed)."""
    return engine_section(model_path, speculative={**SPECULATIVE, "draft_model_path": draft_path},
                          enable_metrics=True, **overrides)


def small_pool_engine_section(model_path: str) -> dict[str, Any]:
    """The small pool's engine: the pool's section with a 1,024-token KV pool that admits
    as if outputs were short, and metrics on (sglang:num_retracted_requests_total and
    sglang:token_usage are read)."""
    return engine_section(model_path, max_total_tokens=SMALL_POOL_TOKENS, enable_metrics=True,
                          extra_args={"schedule-conservativeness": SMALL_POOL_CONSERVATIVENESS})


WORD = tk.WORD_BASE + 5  # the scripted model continues words forever: outputs reach the budget
# A raw request's bound: up to ~250 tokens of a real CPU engine, speculative or not. Idle it
# answers in a few seconds; beside a CPU-bound process and the suite (load ~40 on 2 cores)
# the speculative engine's 154-token answer took more than 30 s (http's default).
REQUEST_TIMEOUT_S = 300


def engine_answer(url: str, n_input: int, budget: int) -> tuple[int, Optional[int]]:
    """(status, the length SGLang enforced) for a raw request of ``n_input`` word tokens
    (the scripted model continues them to the budget)."""
    from tests.support.simulator import http
    status, body = http(url, "/generate", {
        "input_ids": [WORD] * n_input, "rid": f"edge-{n_input}-{budget}",
        "sampling_params": {"max_new_tokens": budget, "temperature": 0, "ignore_eos": True}},
        timeout=REQUEST_TIMEOUT_S)
    if status != 200:
        return status, None
    finish = body["meta_info"]["finish_reason"]
    assert finish["type"] == "length", body["meta_info"]
    return status, finish["length"]


def output_ids(url: str, input_ids: list[int], budget: int) -> list[int]:
    """The token ids the engine at ``url`` generates for ``input_ids`` (greedy), asked
    directly (no Serve, no raygen client)."""
    from tests.support.simulator import http
    status, body = http(url, "/generate", {
        "input_ids": input_ids, "sampling_params": {"max_new_tokens": budget, "temperature": 0}},
        timeout=REQUEST_TIMEOUT_S)
    assert status == 200, body
    return body["output_ids"]


def one_shot(url: str, input_ids: list[int], budget: int, logprobs: int) -> dict:
    """The engine's /generate body for ``input_ids`` (greedy) in one request, logprobs
    asked (top ``logprobs``) as raygen asks them: with require_reasoning, so with strict
    thinking SGLang masks EOS while the row thinks, as in the job's requests."""
    from serve_apps.engine_client import generate_body
    from tests.support.simulator import http
    status, body = http(url, "/generate", generate_body(
        input_ids, {"max_new_tokens": budget, "temperature": 0}, "one-shot",
        require_reasoning=True, logprobs=logprobs), timeout=REQUEST_TIMEOUT_S)
    assert status == 200, body
    return body


def chat_ids(question: str) -> list[int]:
    """A one-turn prompt as raygen renders it (builtin ChatML, thinking on)."""
    return tk.encode(render_prompt([{"role": "user", "content": question}]))
