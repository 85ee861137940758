"""A row of job.sampling.thinking false through the replica's request path: the prompt
rendered with thinking off (the builtin template's empty think block; a model template
asked for enable_thinking=False), ``thinking`` never sent to the engine,
require_reasoning false and no thinking budget (fresh or continued), and the whole
output as the answer with no integrity flag. Answered by the simulator's real aiohttp
app on 127.0.0.1, in this process."""

from __future__ import annotations

from contract.protocol import GenerateRequest
from contract.simulator_settings import SimulatorSettings
from serve_apps.chat_format import render_prompt
from serve_apps.engine_client import generate_body
from serve_apps.engines.simulator import tokenizer as tk
from serve_apps.output_watch import OutputWatch, result_flags
from tests.support.sim_generator import run_recording

SETTINGS = SimulatorSettings(context_length=512, time_scale=0.0, accept_length=0.0,
                             length_median_tokens=40.0, enable_strict_thinking=True)
MESSAGES = [{"role": "user", "content": "say it without thinking"}]
OFF = {"temperature": 0, "thinking": False}


def test_thinking_is_raygen_s_and_never_an_sglang_param():
    body = generate_body([1], {"max_new_tokens": 8, "thinking": False}, "r",
                         require_reasoning=False)
    assert body["sampling_params"] == {"max_new_tokens": 8} and not body["require_reasoning"]


def test_the_builtin_template_closes_the_thinking_in_the_prompt():
    assert render_prompt(MESSAGES, thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_prompt(MESSAGES).endswith("<|im_start|>assistant\n<think>\n")


def _run(calls, render=None):
    return run_recording(SETTINGS, calls, render)


def _chat(sampling: dict, max_new: int = 256) -> GenerateRequest:
    return GenerateRequest(key="k", run="r", category="c", max_new_tokens=max_new,
                           sampling=dict(sampling), messages=MESSAGES)


def test_a_thinking_off_row_is_all_answer_and_raises_no_flag():
    async def calls(gen, sent):
        return (await gen.generate(_chat(OFF)), await gen.generate(_chat({"temperature": 0})),
                sent)
    off, on, sent = _run(calls)
    assert tk.decode(off.prompt_token_ids).endswith("<think>\n\n</think>\n\n")
    assert [b["require_reasoning"] for b in sent] == [False, True]
    assert all("thinking" not in b["sampling_params"] for b in sent)
    assert off.finish_reason == "stop" and off.answer and off.reasoning == ""
    assert off.answer == tk.decode(off.output_token_ids[:-1]).strip()  # the whole output
    assert tk.THINK_END_ID not in off.output_token_ids
    assert (off.finished_thinking, off.reasoning_tokens) == (True, 0)
    assert result_flags(off) == [] and result_flags(on) == []
    # the same row split as a thinking row is what raygen flagged before thinking off
    assert result_flags(on.__class__(key="k", finish_reason="stop", reasoning=off.answer,
                                     answer="", finished_thinking=False,
                                     output_token_ids=off.output_token_ids)) == [
        "missing_think_end"]
    watch = OutputWatch(0.5, window=4)
    for _ in range(4):
        watch.observe("r", off)
    assert watch.drained is None  # a thinking-off fleet is sound


def test_a_cut_thinking_off_row_continues_to_the_same_output_without_thinking():
    async def calls(gen, sent):
        whole = await gen.generate(_chat(OFF | {"max_thinking_tokens": 4}))
        cut = await gen.generate(_chat(OFF, max_new=3))
        rest = await gen.generate(GenerateRequest(
            key="k", run="r", category="c", max_new_tokens=253, sampling=dict(OFF),
            input_ids=cut.prompt_token_ids + cut.output_token_ids,
            prompt_len=len(cut.prompt_token_ids)))
        return whole, cut, rest, sent
    whole, cut, rest, sent = _run(calls)
    assert cut.finish_reason == "length" and cut.finished_thinking  # cut in its answer
    assert rest.output_token_ids == whole.output_token_ids and rest.answer == whole.answer
    assert (rest.reasoning, rest.reasoning_tokens) == ("", 0)
    assert [b["require_reasoning"] for b in sent] == [False] * 3
    assert all("max_thinking_tokens" not in b for b in sent)  # no thinking to budget


def test_a_model_template_is_asked_for_enable_thinking_false():
    asked = []

    def model_template(messages, tools=None, thinking=True):
        asked.append(thinking)
        return render_prompt(messages, tools, thinking=thinking)

    async def calls(gen, sent):
        return await gen.generate(_chat(OFF)), await gen.generate(_chat({"temperature": 0}))
    off, on = _run(calls, render=model_template)
    assert asked == [False, True] and off.reasoning == "" and on.reasoning
