"""job.logprobs on the replica's side: the /generate fields only when asked, SGLang
0.5.23's meta_info read into one entry per output token (or the row failed naming its
key), and a continuation's logprobs, appended by the job, equal to one request's."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from contract.protocol import GenerateRequest
from contract.simulator_settings import SimulatorSettings
from jobs.pipeline.rows import continued_logprobs
from serve_apps.engine_client import MalformedLogprobs, generate_body, parse_logprobs
from tests.support.sim_generator import run_recording, simulator_generator

LOGPROB_FIELDS = {"return_logprob", "top_logprobs_num", "logprob_start_len"}
SETTINGS = SimulatorSettings(time_scale=0.0)
MESSAGES = [{"role": "user", "content": "logprobs, please"}]


def test_the_request_has_no_logprob_field_unless_asked():
    off = generate_body([1, 2, 3], {"temperature": 0.0}, "r")
    assert not LOGPROB_FIELDS & set(off)
    assert off == {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0.0}, "rid": "r",
                   "stream": False, "require_reasoning": True}  # as before job.logprobs
    for top in (0, 5):
        on = generate_body([1, 2, 3], {"temperature": 0.0}, "r", logprobs=top)
        # logprob_start_len = the input's length: no input token's logprob is computed
        assert {k: on[k] for k in LOGPROB_FIELDS} == {
            "return_logprob": True, "top_logprobs_num": top, "logprob_start_len": 3}
        assert {k: v for k, v in on.items() if k not in LOGPROB_FIELDS} == off


def _body(output_ids, sampled, tops=None):
    """A /generate body as SGLang 0.5.23 sends it (return_text_in_logprobs false)."""
    meta = {"output_token_logprobs": sampled, "input_token_logprobs": []}
    if tops is not None:
        meta["output_top_logprobs"] = tops
    return {"text": "", "output_ids": output_ids, "meta_info": meta}


def test_sglang_s_meta_info_becomes_one_entry_per_output_token():
    body = _body([7, 9], [[-0.25, 7, None], [-1.5, 9, None]],
                 [[[-0.25, 7, None], [-2.0, 8, None]], [[-0.5, 4, None], [-1.5, 9, None]]])
    got = parse_logprobs(body, 2)
    assert got.sampled == [-0.25, -1.5]
    assert got.top_ids == [[7, 8], [4, 9]] and got.top_logprobs == [[-0.25, -2.0], [-0.5, -1.5]]
    assert parse_logprobs(body, 0).top_ids is None  # top 0: the sampled token's only
    # An alternative the engine masked comes as null (orjson's -inf): stored as -inf.
    masked = _body([7], [[-0.1, 7, None]], [[[-0.1, 7, None], [None, 3, None]]])
    assert parse_logprobs(masked, 2).top_logprobs == [[-0.1, float("-inf")]]


@pytest.mark.parametrize("body, top, fragment", [
    (_body([7, 9], None), 0, "no output_token_logprobs"),
    (_body([7, 9], [[-0.25, 7, None]]), 0, "1 output_token_logprobs for 2 output tokens"),
    (_body([7], [[-0.25, 8, None]]), 0, "is for token 8, the output's is 7"),
    (_body([7], [[None, 7, None]]), 0, "has logprob None"),
    (_body([7], [[-0.25]]), 0, r"not \[logprob, token_id, text\]"),
    (_body([7], [[-0.25, 7, None]]), 2, "no output_top_logprobs for 1 output tokens"),
    (_body([7], [[-0.25, 7, None]], [[[-0.25, 7, None]]]), 2, "has 1 entries, not 2"),
])
def test_a_malformed_answer_is_refused_saying_what_is_wrong(body, top, fragment):
    with pytest.raises(MalformedLogprobs, match=fragment):
        parse_logprobs(body, top)


def _chat(logprobs, max_new=40, **over) -> GenerateRequest:
    return GenerateRequest(key="row-7", run="r", category="c", max_new_tokens=max_new,
                           sampling={"temperature": 0.0}, logprobs=logprobs,
                           **{"messages": MESSAGES, **over})


def test_a_row_asked_for_logprobs_gets_one_per_output_token_and_none_otherwise():
    async def calls(gen, sent):
        return await gen.generate(_chat(5)), await gen.generate(_chat(None)), sent
    on, off, sent = run_recording(SETTINGS, calls)
    n = len(on.output_token_ids)
    assert on.error_class is None and n > 0
    assert len(on.output_logprobs) == len(on.output_top_logprob_ids) == n
    assert all(len(t) == 5 for t in on.output_top_logprobs)
    assert (off.output_logprobs, off.output_top_logprob_ids, off.output_top_logprobs) == (
        None, None, None)
    assert off.output_token_ids == on.output_token_ids
    assert LOGPROB_FIELDS <= set(sent[0]) and not LOGPROB_FIELDS & set(sent[1])


def test_a_continued_row_s_logprobs_appended_equal_one_request_s():
    async def calls(gen, sent):
        whole = await gen.generate(_chat(3, max_new=60))
        cut = await gen.generate(_chat(3, max_new=25))
        rest = await gen.generate(_chat(
            3, max_new=35, messages=None, input_ids=cut.prompt_token_ids + cut.output_token_ids,
            prompt_len=len(cut.prompt_token_ids)))
        return whole, cut, rest
    whole, cut, rest = run_recording(SETTINGS, calls)
    assert cut.finish_reason == "length" and rest.output_token_ids == whole.output_token_ids
    assert len(rest.output_logprobs) == len(whole.output_token_ids) - 25  # its own tokens
    base = {"key": "row-7", "version": 0, "output_logprobs": cut.output_logprobs,
            "output_top_logprob_ids": cut.output_top_logprob_ids,
            "output_top_logprobs": cut.output_top_logprobs}
    row = continued_logprobs(base, rest)
    assert row == {"output_logprobs": whole.output_logprobs,
                   "output_top_logprob_ids": whole.output_top_logprob_ids,
                   "output_top_logprobs": whole.output_top_logprobs}


def test_an_answer_without_the_logprobs_asked_fails_the_row_naming_its_key():
    @web.middleware
    async def strip(request, handler):
        response = await handler(request)
        if request.path == "/generate" and response.status == 200:
            body = json.loads(response.body)
            del body["meta_info"]["output_token_logprobs"]
            return web.json_response(body)
        return response

    async def go():
        async with simulator_generator(SETTINGS, [strip]) as gen:
            return await gen.generate(_chat(0))
    result = asyncio.run(go())
    assert result.error_class == "engine_malformed"
    assert "row 'row-7'" in result.error_message
    assert "no output_token_logprobs" in result.error_message
    assert result.output_logprobs is None
