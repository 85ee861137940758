"""Where a prompt's assistant turns lie (job.regenerate every_turn's loss mask): the
builtin renderer's character spans, the probed spans of a template raygen cannot read,
the replica's token spans against the simulator's real app and tokenizer (127.0.0.1, in
this process), and the tool calls a reply made."""

from __future__ import annotations

import asyncio

import pytest

from contract.protocol import GenerateRequest
from contract.simulator_settings import SimulatorSettings
from serve_apps.chat_format import (IM_END, assistant_spans, parse_tool_calls,
                                    probed_assistant_spans, render_prompt)
from serve_apps.engines.simulator import tokenizer as tk
from tests.support.sim_generator import simulator_generator

TOOLS = [{"type": "function", "function": {"name": "search_docs", "parameters": {}}}]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "search_docs", "arguments": '{"query": "retry"}'}}
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "Why?"},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL],
     "reasoning_content": "dropped by the template"},
    {"role": "tool", "content": "Because."},
    {"role": "assistant", "content": "Because?"},  # ends like the user's: no overlap
    {"role": "user", "content": "Sure?"},
]
BODIES = ['Let me look.\n<tool_call>\n{"name": "search_docs", "arguments": {"query": "retry"}}'
          '\n</tool_call>', "Because?"]


def test_builtin_spans_are_each_assistant_body_through_its_end_of_turn_token():
    text = render_prompt(MESSAGES, TOOLS)
    spans = assistant_spans(MESSAGES, TOOLS)
    assert [text[s:e] for s, e in spans] == [b + IM_END for b in BODIES]
    assert "dropped by the template" not in text  # earlier reasoning: as Qwen3 drops it
    plain = MESSAGES[1:2] + MESSAGES[4:]
    assert [render_prompt(plain)[s:e] for s, e in assistant_spans(plain)] == [
        "Because?" + IM_END]


def test_probed_spans_find_the_content_a_template_renders():
    probed = probed_assistant_spans(render_prompt)(MESSAGES, TOOLS)
    text = render_prompt(MESSAGES, TOOLS)
    # the content; tool calls after it and the end-of-turn token are outside (documented)
    assert [text[s:e] for s, e in probed] == ["Let me look.", "Because?"]


def test_parse_tool_calls_reads_the_blocks_the_renderer_writes():
    content, calls = parse_tool_calls(BODIES[0])
    assert content == "Let me look."
    assert calls == [{"name": "search_docs", "arguments": {"query": "retry"}}]
    assert parse_tool_calls("no calls") == ("no calls", [])
    assert parse_tool_calls("<tool_call>[1]</tool_call>")[1] == [{"name": None,
                                                                  "arguments": "[1]"}]


def test_the_replica_returns_token_spans_of_every_assistant_turn_when_asked():
    settings = SimulatorSettings(context_length=4096, time_scale=0.0, accept_length=0.0)

    async def go():
        async with simulator_generator(settings) as gen:
            asked = await gen.generate(GenerateRequest(
                key="k", run="r", category="c", max_new_tokens=8, sampling={},
                messages=MESSAGES, tools=TOOLS, assistant_spans=True))
            plain = await gen.generate(GenerateRequest(
                key="k", run="r", category="c", max_new_tokens=8, sampling={},
                messages=MESSAGES, tools=TOOLS))
            return asked, plain
    asked, plain = asyncio.run(go())
    assert asked.error_class is None, asked.error_message
    ids = asked.prompt_token_ids
    assert ids == tk.encode(render_prompt(MESSAGES, TOOLS)) == plain.prompt_token_ids
    assert [tk.decode(ids[s:e], skip_special_tokens=False) for s, e in asked.assistant_spans
            ] == [b + IM_END for b in BODIES]
    assert plain.assistant_spans is None  # not asked: no extra tokenize calls


@pytest.mark.sglang_set  # transformers renders the model's template
def test_probed_spans_of_a_model_template_that_keeps_reasoning(tmp_path):
    from serve_apps.chat_format import model_template_renderer
    from tests.support.trainer_templates import QWEN3, tokenizer_dir
    render = model_template_renderer(str(tokenizer_dir(tmp_path / "qwen3", QWEN3)))
    messages = [{"role": "user", "content": "Why?"},
                {"role": "assistant", "content": "Because.", "reasoning_content": "hm"},
                {"role": "user", "content": "Sure?"}]
    text = render(messages)
    (start, end), = probed_assistant_spans(render)(messages)
    assert text[start:end] == "hm\n</think>\n\nBecause."  # the reasoning it keeps, too
    plain = [dict(m, reasoning_content="") if m["role"] == "assistant" else m
             for m in messages]
    (start, end), = probed_assistant_spans(render)(plain)
    assert render(plain)[start:end] == "Because."
