"""What the replica sends for a thinking budget: max_thinking_tokens moved from raygen's
sampling to the request's top level, and for a continuation the budget left (still
thinking) or no budget and require_reasoning false (past the think end). Answered by
the simulator's real aiohttp app on 127.0.0.1, in this process."""

from __future__ import annotations

from contract.protocol import GenerateRequest
from contract.simulator_settings import SimulatorSettings
from serve_apps.engine_client import generate_body
from serve_apps.engines.simulator import tokenizer as tk
from tests.support import sglang_cpu
from tests.support.sim_generator import run_recording

SETTINGS = SimulatorSettings(context_length=256, time_scale=0.0, accept_length=0.0,
                             length_median_tokens=30.0, enable_strict_thinking=True)
PROMPT = sglang_cpu.chat_ids("what do the two engines say")  # thinks 10 words + </think>


def test_the_budget_is_a_request_field_not_a_sampling_param():
    body = generate_body([1, 2], {"max_new_tokens": 8, "max_thinking_tokens": 5}, "r")
    assert body["max_thinking_tokens"] == 5 and body["sampling_params"] == {"max_new_tokens": 8}
    assert body["require_reasoning"] is True
    unset = generate_body([1, 2], {"max_new_tokens": 8}, "r", require_reasoning=False)
    assert "max_thinking_tokens" not in unset and unset["require_reasoning"] is False


def _run(calls, settings: SimulatorSettings = SETTINGS):
    """``calls(generator, sent)`` against the simulator; ``sent``: the /generate bodies."""
    return run_recording(settings, calls)


def _request(budget, max_new: int, output: list[int] | None = None) -> GenerateRequest:
    sampling = {"temperature": 0} | ({} if budget is None else {"max_thinking_tokens": budget})
    if output is None:
        return GenerateRequest(key="k", run="r", category="c", max_new_tokens=max_new,
                               sampling=sampling, input_ids=list(PROMPT))
    return GenerateRequest(key="k", run="r", category="c", max_new_tokens=max_new,
                           sampling=sampling, input_ids=PROMPT + output,
                           prompt_len=len(PROMPT))


def test_a_continued_row_thinks_as_long_as_one_run_under_the_budget():
    async def calls(gen, sent):
        whole = await gen.generate(_request(3, 64))
        thinking = await gen.generate(_request(3, 2))                       # cut at 2 of 3
        cont_thinking = await gen.generate(_request(3, 62, thinking.output_token_ids))
        answering = await gen.generate(_request(3, 6))                      # cut after </think>
        cont_answer = await gen.generate(_request(3, 58, answering.output_token_ids))
        return whole, thinking, cont_thinking, answering, cont_answer, sent
    whole, thinking, cont_thinking, answering, cont_answer, sent = _run(calls)
    assert whole.output_token_ids[3] == tk.THINK_END_ID and whole.reasoning_tokens == 4
    assert not thinking.finished_thinking and answering.finished_thinking
    assert cont_thinking.output_token_ids == cont_answer.output_token_ids == whole.output_token_ids
    assert cont_thinking.finish_reason == cont_answer.finish_reason == "stop"
    # what went to the engine: the row's budget, the budget left, none past the think end
    assert [b.get("max_thinking_tokens") for b in sent] == [3, 3, 1, 3, None]
    assert [b["require_reasoning"] for b in sent] == [True, True, True, True, False]
    assert all("max_thinking_tokens" not in b["sampling_params"] for b in sent)


def test_without_strict_thinking_the_engine_refuses_the_budget_as_sglang_does():
    async def calls(gen, sent):
        return await gen.generate(_request(3, 64))
    result = _run(calls, SETTINGS.model_copy(update={"enable_strict_thinking": False}))
    assert result.error_class == "bad_request"
    assert "max_thinking_tokens requires the server to be launched with " \
           "--enable-strict-thinking" in result.error_message
