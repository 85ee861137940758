"""serve_apps.chat_format: the ChatML-with-thinking prompt and the reasoning split."""

from __future__ import annotations

import json

from serve_apps.chat_format import render_prompt, split_reasoning

GEN = "<|im_start|>assistant\n<think>\n"


def test_single_user_message():
    out = render_prompt([{"role": "user", "content": "2+2?"}])
    assert out == "<|im_start|>user\n2+2?<|im_end|>\n" + GEN
    assert out.endswith(GEN)


def test_thinking_off_closes_empty_think_block():
    out = render_prompt([{"role": "user", "content": "hi"}], thinking=False)
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_system_without_tools_kept_in_order():
    out = render_prompt([{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "hi"}])
    assert out == ("<|im_start|>system\nbe brief<|im_end|>\n"
                   "<|im_start|>user\nhi<|im_end|>\n" + GEN)


def test_system_and_tools_in_one_system_message():
    tool = {"type": "function", "function": {"name": "get_weather",
                                             "parameters": {"type": "object"}}}
    out = render_prompt([{"role": "system", "content": "You are helpful."},
                         {"role": "user", "content": "weather?"}], tools=[tool])
    assert out.count("<|im_start|>system") == 1
    system, rest = out.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou are helpful.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(tool, sort_keys=True)}\n</tools>" in system
    assert "<tool_call></tool_call>" in system
    assert rest == "<|im_start|>user\nweather?<|im_end|>\n" + GEN


def test_tools_without_system_message_get_a_system_block():
    tools = [{"type": "function", "function": {"name": "a"}},
             {"type": "function", "function": {"name": "b"}}]
    out = render_prompt([{"role": "user", "content": "go"}], tools=tools)
    assert out.startswith("<|im_start|>system\n")
    body = out.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line)["function"]["name"] for line in body.split("\n")] == ["a", "b"]
    assert "<|im_start|>user\ngo<|im_end|>\n" in out
    assert out.endswith(GEN)


def test_render_does_not_mutate_messages():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    render_prompt(msgs, tools=[{"name": "f"}])
    assert len(msgs) == 2


def test_tool_role_becomes_user_tool_response():
    out = render_prompt([{"role": "user", "content": "q"},
                         {"role": "tool", "content": "{\"t\": 21}"}])
    assert ("<|im_start|>user\n<tool_response>\n{\"t\": 21}\n</tool_response><|im_end|>\n"
            in out)
    assert "<|im_start|>tool" not in out


def test_assistant_tool_calls_with_json_string_arguments():
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
    out = render_prompt([{"role": "user", "content": "q"},
                         {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "content": "sunny"}])
    expected_body = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
    assert (f"<|im_start|>assistant\n<tool_call>\n{expected_body}\n</tool_call><|im_end|>\n"
            in out)


def test_assistant_text_then_tool_calls_and_dict_and_bad_arguments():
    calls = [{"function": {"name": "a", "arguments": {"x": 1}}},
             {"function": {"name": "b", "arguments": "not json"}},
             {"name": "c"}]
    out = render_prompt([{"role": "user", "content": "q"},
                         {"role": "assistant", "content": "Let me check.", "tool_calls": calls},
                         {"role": "tool", "content": "r"}])
    block = out.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    assert block == ("Let me check.\n"
                     "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
                     "<tool_call>\n{\"name\": \"b\", \"arguments\": \"not json\"}\n</tool_call>\n"
                     "<tool_call>\n{\"name\": \"c\", \"arguments\": {}}\n</tool_call>")


def test_non_ascii_not_escaped():
    out = render_prompt([{"role": "user", "content": "q"}], tools=[{"name": "météo"}])
    assert "météo" in out


def test_split_reasoning_with_think_end():
    text = "\nI add 2 and 2.\n</think>\n\nThe answer is 4.\n"
    assert split_reasoning(text) == ("I add 2 and 2.", "The answer is 4.", True)


def test_split_reasoning_without_think_end():
    assert split_reasoning("  still thinking about") == ("still thinking about", "", False)


def test_split_reasoning_only_first_think_end_splits():
    assert split_reasoning("a</think>b</think>c") == ("a", "b</think>c", True)


def test_split_reasoning_empty_and_custom_marker():
    assert split_reasoning("") == ("", "", False)
    assert split_reasoning("</think>") == ("", "", True)
    assert split_reasoning("r<END>a", think_end="<END>") == ("r", "a", True)
