"""SGLang native contract of the real simulator process (zero-latency, default model)."""

import urllib.error
import urllib.request

import pytest

from serve_apps.engines.simulator import model as m
from serve_apps.engines.simulator import tokenizer as tk

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
P = m.LengthParams()


def prompt_text(lo: int, hi: int) -> str:
    for i in range(100_000):
        text = CHAT.format(f"question number {i}")
        if lo <= m.natural_output_length(tk.encode(text), P) <= hi:
            return text
    raise AssertionError("no prompt found")


def gen(sim, **body):
    return sim.call("/generate", body)


def assert_error(status, body, code, fragment):
    """SGLang's validation error body: {"error": {"message": ...}} (http_server._create_error_response)."""
    assert status == code, body
    assert set(body) == {"error"} and set(body["error"]) == {"message"}, body
    assert fragment in body["error"]["message"], body["error"]["message"]


def test_response_shape_and_meta_info(sim_fast):
    text = prompt_text(300, 3000)
    status, body = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 8192, "temperature": 0.7, "top_p": 0.9}, rid="req-1")
    assert status == 200
    assert set(body) == {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    ids = body["output_ids"]
    n_in = len(tk.encode(text))
    assert meta["id"] == "req-1"
    assert meta["finish_reason"] == {"type": "stop", "matched": tk.EOS_ID}
    assert ids[-1] == tk.EOS_ID and "<|im_end|>" not in body["text"]
    assert meta["prompt_tokens"] == n_in and meta["completion_tokens"] == len(ids) == m.natural_output_length(tk.encode(text), P)
    # Counted only when asked for (require_reasoning), as SGLang does.
    assert meta["reasoning_tokens"] == 0
    assert meta["weight_version"] == "default" and meta["num_retractions"] == 0
    assert isinstance(meta["cached_tokens"], int) and 0 <= meta["cached_tokens"] < n_in
    assert 0 <= meta["e2e_latency"] < 1.0
    verify = meta["spec_verify_ct"]
    assert verify >= 1 and meta["spec_accept_length"] == pytest.approx(len(ids) / verify)
    assert 2.0 <= meta["spec_accept_length"] <= 3.5
    # TokenizerManager's formulas: drafts proposed = verify x (draft tokens - 1); accepted = the rest.
    assert meta["spec_num_proposed_drafts"] == verify * 3
    assert meta["spec_num_correct_drafts"] == len(ids) - verify
    assert meta["spec_accept_rate"] == pytest.approx((len(ids) - verify) / (verify * 3))
    assert body["text"] == tk.decode(ids[:-1])
    _, asked = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 8192}, require_reasoning=True)
    assert asked["meta_info"]["reasoning_tokens"] == ids.index(tk.THINK_END_ID) + 1
    # rid is generated when absent.
    _, other = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 4})
    assert isinstance(other["meta_info"]["id"], str) and other["meta_info"]["id"]


def test_think_split_present_in_text(sim_fast):
    _, body = gen(sim_fast, text=prompt_text(300, 3000), sampling_params={"max_new_tokens": 8192})
    thinking, sep, answer = body["text"].partition("</think>")
    assert thinking.startswith("<think>\n") and sep and answer.startswith("\n\n") and len(answer.split()) >= 1


def test_default_max_new_tokens_is_128(sim_fast):
    status, body = gen(sim_fast, text=prompt_text(500, 5000))
    assert status == 200
    assert body["meta_info"]["completion_tokens"] == 128
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 128}


def test_unknown_sampling_key_is_named(sim_fast):
    # SGLang's typed contract answers with a plain-string error (http_server.generate_request).
    status, body = gen(sim_fast, text="hi", sampling_params={"max_new_tokens": 4, "max_tokens": 10})
    assert status == 400 and isinstance(body["error"], str), body
    assert body["error"].startswith("unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`")


@pytest.mark.parametrize(
    "sampling, fragment",
    [
        ({"temperature": -1}, "temperature must be a non-negative finite number, got -1."),
        ({"top_p": 0}, "top_p must be in (0, 1]"),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0"),
        ({"max_new_tokens": 2, "min_new_tokens": 3}, "min_new_tokens must be in [0, max_new_tokens(2)]"),
        ({"n": 2}, "n=1"),
        ({"stop": 5}, "stop must be"),
        ({"ignore_eos": "yes"}, "ignore_eos must be a boolean"),
    ],
)
def test_invalid_sampling_values(sim_fast, sampling, fragment):
    status, body = gen(sim_fast, text="hi", sampling_params=sampling)
    assert_error(status, body, 400, fragment)


def test_context_length_messages(sim_fast):
    ids = [tk.BYTE_BASE + 97] * 32768
    status, body = gen(sim_fast, input_ids=ids, sampling_params={"max_new_tokens": 1})
    assert_error(status, body, 400, "The input (32768 tokens) is longer than the model's context length (32768 tokens).")
    status, body = gen(sim_fast, input_ids=ids[:32000], sampling_params={"max_new_tokens": 1000})
    assert_error(
        status,
        body,
        400,
        "Requested token count exceeds the model's maximum context length of 32768 tokens. You requested a total of "
        "33000 tokens: 32000 tokens from the input messages and 1000 tokens for the completion. Please reduce the "
        "number of tokens in the input messages or the completion to fit within the limit.",
    )
    # Exactly filling the context passes the tokenizer manager's check, but the scheduler
    # silently clamps the budget to context - input - 2 (Scheduler.init_req_max_new_tokens).
    status, body = gen(sim_fast, input_ids=ids[:32000], sampling_params={"max_new_tokens": 768, "ignore_eos": True})
    assert status == 200 and body["meta_info"]["finish_reason"] == {"type": "length", "length": 766}
    assert body["meta_info"]["completion_tokens"] == 766
    status, body = gen(sim_fast, input_ids=ids[:32700], sampling_params={"ignore_eos": True})
    assert status == 200 and body["meta_info"]["completion_tokens"] == 66
    # The scheduler refuses input >= context - 6 (validate_input_length).
    status, body = gen(sim_fast, input_ids=ids[:32762], sampling_params={"max_new_tokens": 1})
    assert_error(status, body, 400, "Input length (32762 tokens) exceeds the maximum allowed length (32762 tokens). "
                 "Use a shorter input or enable --allow-auto-truncate.")


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"text": "a", "input_ids": [1, 2]}, "Either text or input_ids"),
        ({}, "Either text or input_ids"),
        ({"text": ["a", "b"]}, "the simulator accepts one prompt per request"),
        ({"input_ids": [[1, 2], [3]]}, "the simulator accepts one prompt per request"),
        ({"text": "a", "sampling_params": [{}, {}]}, "the simulator accepts one prompt per request"),
        ({"text": "a", "stream": True}, "stream is not supported by the simulator"),
        ({"input_ids": [1, "x"]}, "input_ids must be a list of integers"),
        ({"input_ids": [-5]}, "input_ids must lie in"),
        ({"text": ""}, "The input is empty."),
    ],
)
def test_bad_inputs(sim_fast, body, fragment):
    status, resp = gen(sim_fast, **body)
    assert_error(status, resp, 400, fragment)


def test_invalid_json_is_400(sim_fast):
    req = urllib.request.Request(sim_fast.base + "/generate", data=b"{not json", method="POST")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("expected 400")
    except urllib.error.HTTPError as e:
        assert e.code == 400


def test_unknown_top_level_keys_are_ignored(sim_fast):
    status, body = gen(sim_fast, text="hi", sampling_params={"max_new_tokens": 3}, return_logprob=False, return_prompt_token_ids=True, lora_path=None)
    assert status == 200 and set(body) == {"text", "output_ids", "meta_info"}


def test_deterministic_across_calls_and_text_equals_input_ids(sim_fast):
    text = CHAT.format("determinism")
    a = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 500})[1]
    b = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 500, "temperature": 1.5})[1]
    c = gen(sim_fast, input_ids=tk.encode(text), sampling_params={"max_new_tokens": 500})[1]
    assert a["output_ids"] == b["output_ids"] == c["output_ids"] and a["text"] == b["text"] == c["text"]
    assert len(a["output_ids"]) == 500


def test_exact_continuation_over_http(sim_fast):
    text = prompt_text(4300, 8000)
    ids = tk.encode(text)
    first = gen(sim_fast, input_ids=ids, sampling_params={"max_new_tokens": 4096})[1]
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 4096}
    second = gen(sim_fast, input_ids=ids + first["output_ids"], sampling_params={"max_new_tokens": 4096})[1]
    single = gen(sim_fast, input_ids=ids, sampling_params={"max_new_tokens": 8192})[1]
    assert first["output_ids"] + second["output_ids"] == single["output_ids"]
    assert second["meta_info"]["finish_reason"] == single["meta_info"]["finish_reason"] == {"type": "stop", "matched": tk.EOS_ID}
    assert first["text"] + second["text"] == single["text"]
    # The continuation's prompt (input + first output) is in the prefix cache.
    assert second["meta_info"]["cached_tokens"] >= len(ids) + 4096 - 16


def test_stop_strings_over_http(sim_fast):
    text = prompt_text(500, 3000)
    full = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 8192})[1]["text"]
    stop = " " + full.split(" ")[10]
    status, body = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 8192, "stop": [stop]})
    assert status == 200
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert body["text"] == full[: full.find(stop)]
    _, kept = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 8192, "stop": stop, "no_stop_trim": True})
    assert kept["text"] == full[: full.find(stop) + len(stop)]
    _, by_id = gen(sim_fast, text=text, sampling_params={"max_new_tokens": 8192, "stop_token_ids": [tk.THINK_END_ID]})
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": tk.THINK_END_ID}
    assert by_id["text"] == full[: full.find("</think>")]


def test_ignore_eos_over_http(sim_fast):
    text = prompt_text(100, 1000)
    natural = m.natural_output_length(tk.encode(text), P)
    _, body = gen(sim_fast, text=text, sampling_params={"max_new_tokens": natural + 300, "ignore_eos": True})
    assert body["meta_info"]["completion_tokens"] == natural + 300
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": natural + 300}
    assert tk.EOS_ID not in body["output_ids"]


def test_skip_special_tokens_false_keeps_think_tags_only(sim_fast):
    _, body = gen(sim_fast, text=prompt_text(100, 1000), sampling_params={"max_new_tokens": 8192, "skip_special_tokens": False})
    assert "<think>" in body["text"] and "</think>" in body["text"] and "<|im_end|>" not in body["text"]


def test_tokenize_and_detokenize(sim_fast):
    text = "<|im_start|>user\nnaïve 😀<|im_end|>\n"
    status, body = sim_fast.call("/tokenize", {"prompt": text, "add_special_tokens": False})
    assert status == 200 and body == {"tokens": tk.encode(text), "count": len(tk.encode(text)), "max_model_len": 32768}
    status, body = sim_fast.call("/detokenize", {"tokens": body["tokens"], "skip_special_tokens": False})
    assert status == 200 and body == {"text": text}
    status, body = sim_fast.call("/detokenize", {"tokens": [10**6]})
    assert_error(status, body, 400, "outside the vocabulary")


def test_health_and_server_info(sim_fast):
    assert sim_fast.call("/health")[0] == 200
    assert sim_fast.call("/health_generate")[0] == 200
    status, info = sim_fast.call("/server_info")
    assert status == 200
    assert info["model_path"] == "sim-qwen" and info["context_length"] == 32768 and info["max_running_requests"] == 48
    assert info["version"] == "0.5.23-sim"
    # Speculation as SGLang's resolved server args report it: NEXTN 3/1/4 runs as EAGLE.
    assert [info[f"speculative_{k}"] for k in ("algorithm", "num_steps", "eagle_topk", "num_draft_tokens")] == \
        ["EAGLE", 3, 1, 4]
    assert info["simulator"]["time_scale"] == 0.0 and info["simulator"]["length_sigma"] == P.sigma
    assert sim_fast.call("/get_server_info") == (status, info)


def test_metrics_names_and_counters(sim_fast):
    before = sim_fast.metrics()
    _, body = gen(sim_fast, text="count me", sampling_params={"max_new_tokens": 37, "ignore_eos": True})
    after = sim_fast.metrics()
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
        "sglang:spec_accept_length",
        "sglang:sim_capacity_tok_s",
        "sglang:generation_tokens_total",
        "sglang:prompt_tokens_total",
        "sglang:num_requests_total",
        "sglang:scheduler_idle_seconds_total",  # SGLang 0.5.23's name; jobs/runs/engine_idle.py
    ):
        assert name in after, name
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 37
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == len(tk.encode("count me"))
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == 1
    assert after["sglang:sim_capacity_tok_s"] == 0.0  # zero-latency: unbounded, reported as 0
    assert after["sglang:spec_accept_length"] > 1.0
    status, text = sim_fast.call("/metrics")
    assert "# TYPE sglang:generation_tokens_total counter" in text and "# TYPE sglang:num_running_reqs gauge" in text


def test_fault_endpoint_rejects_unknown_keys(sim_fast):
    status, body = sim_fast.call("/sim/faults", {"time_scale": 1.0})
    assert_error(status, body, 400, "time_scale")
    status, body = sim_fast.call("/sim/faults", {"error_rate": 2.0})
    assert_error(status, body, 400, "error_rate")
    status, body = sim_fast.call("/sim/faults")
    assert status == 200 and body["error_rate"] == 0.0


def test_logprobs_only_when_asked_in_sglang_s_shape_and_exact_across_a_continuation(sim_fast):
    ids = tk.encode(CHAT.format("logprobs"))
    plain = gen(sim_fast, input_ids=ids, sampling_params={"max_new_tokens": 40})[1]
    assert not any("logprob" in k for k in plain["meta_info"])  # nothing when not asked

    def asked(input_ids, n, top):
        return gen(sim_fast, input_ids=input_ids, return_logprob=True, top_logprobs_num=top,
                   logprob_start_len=len(input_ids), sampling_params={"max_new_tokens": n})[1]
    whole = asked(ids, 40, 5)
    meta, out = whole["meta_info"], whole["output_ids"]
    assert out == plain["output_ids"]  # asking changes no token
    # SGLang 0.5.23: [logprob, token_id, text-or-null] per output token, no input ones.
    assert meta["input_token_logprobs"] == [] and meta["output_token_logprobs_length"] == 40
    assert [e[1] for e in meta["output_token_logprobs"]] == out
    assert all(e[2] is None and e[0] <= 0 for e in meta["output_token_logprobs"])
    for (lp, token, _), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        values = [e[0] for e in top]
        assert len(top) == 5 and values == sorted(values, reverse=True)
        assert len({e[1] for e in top}) == 5 and lp <= values[0]
        assert (token in [e[1] for e in top]) == (lp >= values[-1])
    assert "output_top_logprobs" not in asked(ids, 40, 0)["meta_info"]  # top 0: none
    # A continuation (prompt + earlier output as input) gets the one-shot's values.
    cut = asked(ids, 15, 5)
    rest = asked(ids + cut["output_ids"], 25, 5)
    for field in ("output_token_logprobs", "output_top_logprobs"):
        assert cut["meta_info"][field] + rest["meta_info"][field] == meta[field]
    status, body = gen(sim_fast, input_ids=ids, return_logprob=True, top_logprobs_num=-1,
                       sampling_params={"max_new_tokens": 4})
    assert_error(status, body, 400, "top_logprobs_num")
