"""raygen's context guard against SGLang's real scheduler, on both sides of every boundary.

The engine runs ``--context-length 256`` without speculation. For each prompt length and
budget around SGLang's limits (the tokenizer manager's two checks, the scheduler's input
limit at context - 6, its silent clamp to context - input - 2), the engine's own answer
to a raw request decides; raygen's arithmetic (contract.context_budget), its per-row
guard (serve_apps.generation.Generator) and its preflight (``--check-context``) must
agree with it: pass exactly when the engine honours the whole budget, clamp to exactly
what the engine then honours, refuse exactly what the engine refuses.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from contract import context_budget
from contract.protocol import GenerateRequest
from serve_apps.engine_client import EngineClient
from serve_apps.generation import Generator
from tests.integration.helpers import run
from tests.support import sglang_cpu

pytestmark = [pytest.mark.integration, pytest.mark.slow]

C = sglang_cpu.CONTEXT
engine_answer = sglang_cpu.engine_answer

# Prompt lengths across SGLang's limits: 249 is the longest it accepts (context - 7),
# 250..255 fail its scheduler's check, 256+ its tokenizer manager's.
EDGES = [100, 190, 191, 192, 248, 249, 250, 251, 255, 256, 300]


@pytest.mark.parametrize("n_input", EDGES)
def test_room_is_exactly_what_the_scheduler_honours(sglang_pool, n_input):
    url = sglang_pool.urls[0]
    room = context_budget.room(C, n_input, reserved=0)
    if room <= 0:  # raygen: no budget fits, not even one token
        assert engine_answer(url, n_input, 1)[0] == 400
        return
    # The whole room is honoured ...
    assert engine_answer(url, n_input, room) == (200, room)
    # ... and one more token is either refused or silently cut back to the room: never
    # more. raygen therefore never sends a budget above the room.
    status, length = engine_answer(url, n_input, room + 1)
    assert status == 400 or length == room, (status, length)
    if n_input + room + 1 <= C:  # the tokenizer manager lets it through: a silent clamp
        assert (status, length) == (200, room)


@pytest.mark.parametrize("n_input, budget, policy", [
    (180, 64, "reject"),    # fits: passes untouched
    (191, 64, "reject"),    # SGLang would clamp silently to 63: raygen rejects instead
    (191, 64, "clamp"),     # ... or clamps to 63 itself, recorded
    (240, 64, "clamp"),     # room 14 < 16 useful tokens: rejected even under clamp
    (249, 4, "reject"),     # the longest accepted prompt, a budget within its room of 5
    (250, 1, "clamp"),      # the scheduler refuses it: never sent
])
def test_the_row_guard_agrees_with_the_engine(sglang_pool, n_input, budget, policy):
    url = sglang_pool.urls[0]

    async def generate():
        client = EngineClient(url, request_timeout_s=60)
        gen = Generator(client, C, "</think>", "test", engine_alive=lambda: True)
        try:
            ids = [sglang_cpu.WORD] * n_input
            return await gen.generate(GenerateRequest(
                key=f"g-{n_input}-{budget}-{policy}", run="t", category="c",
                max_new_tokens=budget, context_policy=policy,
                sampling={"temperature": 0, "ignore_eos": True},
                input_ids=ids, prompt_len=len(ids)))
        finally:
            await client.close()
    result = asyncio.run(generate())
    room = context_budget.room(C, n_input, reserved=0)
    if room >= budget:
        assert result.error_class is None and result.completion_tokens == budget
        assert result.budget_clamped_by == ""
    elif policy == "clamp" and room >= 16:
        assert result.error_class is None
        assert result.effective_max_new_tokens == result.completion_tokens == room
        assert result.budget_clamped_by == "context_guard"  # raygen's, never "engine"
        assert engine_answer(url, n_input, budget) == (200, room)  # what SGLang would do
    else:
        assert result.error_class == "context_overflow", result
        assert engine_answer(url, n_input, budget)[1] != budget  # SGLang: refuse or cut


def test_check_context_counts_what_the_engine_refuses_or_cuts(real_config, sglang_pool,
                                                              tmp_path):
    """--check-context tokenizes through the engines and applies raygen's room: its counts
    must equal the engine's own verdicts on the same prompts at the run's budget."""
    budget = 64
    base = len(sglang_cpu.chat_ids(""))
    lengths = [150, 190, 191, 192, 200, 249, 250, 260]
    rows = tmp_path / "p.jsonl"
    rows.write_text("".join(json.dumps({"id": f"n{n}", "messages": [
        {"role": "user", "content": "x" * (n - base)}]}) + "\n" for n in lengths))
    assert [len(sglang_cpu.chat_ids("x" * (n - base))) for n in lengths] == lengths
    summary = run(real_config(rows, job={"max_new_tokens": budget}), check_context=True)
    report = summary.progress
    url = sglang_pool.urls[1]
    with ThreadPoolExecutor(len(lengths)) as pool:  # at once: the engine batches them
        verdicts = list(pool.map(lambda n: engine_answer(url, n, budget), lengths))
        alone = list(pool.map(lambda n: engine_answer(url, n, 1), lengths))
    short = sum(1 for status, length in verdicts if status != 200 or length != budget)
    refused_alone = sum(1 for status, _ in alone if status == 400)
    assert (report["short_of_full_budget"], report["prompt_alone_too_long"]) == \
        (short, refused_alone) == (6, 2)
    assert report["context_length"] == C  # read from the running engine
