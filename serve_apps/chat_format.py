"""The thinking model's text format, in one place for every engine.

- ``render_prompt``: OpenAI-style chat messages (+ optional tools) -> the prompt text,
  ChatML as Qwen3-family models use it, with thinking on (the generation prompt
  opens ``<think>``) or off (``thinking=False``, job.sampling.thinking: an empty
  ``<think>\n\n</think>\n\n`` block, as Qwen3's template writes for
  enable_thinking=False). SGLang and the simulator get the same text, so what the CPU
  tests cover is what a GPU run sends.
- ``split_reasoning``: output text -> (reasoning, answer, answer_started);
  ``no_thinking`` the same for a thinking-off row (all of it is the answer).
- ``assistant_spans``: where each assistant message lies in the rendered prompt
  (job.regenerate every_turn: the export's loss mask); ``parse_tool_calls``: the
  ``<tool_call>`` blocks a reply made, as the renderer writes them.
  Earlier assistant turns are rendered from their content (and tool calls) only: their
  ``reasoning_content`` is dropped, as Qwen3's template drops earlier turns' reasoning.
A model whose template differs can use ``chat_template: model`` (the tokenizer's own
template, loaded lazily on GPU nodes); the split stays here.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Optional

from contract.thinking import THINK_END, THINK_START

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def _tools_block(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False, sort_keys=True) for t in tools)
    return (
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags."
    )


def normalized_call(call: dict[str, Any]) -> dict[str, Any]:
    """{"name", "arguments"} of a tool call in OpenAI's shape or already flat (arguments
    parsed when they are a JSON string, as OpenAI sends them)."""
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return {"name": fn.get("name"), "arguments": args}


def _tool_calls_text(calls: list[dict[str, Any]]) -> str:
    parts = []
    for call in calls:
        body = json.dumps(normalized_call(call), ensure_ascii=False)
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(parts)


def _message_text(msg: dict[str, Any]) -> str:
    role, content = msg["role"], msg.get("content") or ""
    if role == "tool":
        return f"{IM_START}user\n<tool_response>\n{content}\n</tool_response>{IM_END}\n"
    if role == "assistant" and msg.get("tool_calls"):
        sep = "\n" if content else ""
        content = f"{content}{sep}{_tool_calls_text(msg['tool_calls'])}"
    return f"{IM_START}{role}\n{content}{IM_END}\n"


def _pieces(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]],
            thinking: bool) -> list[tuple[str, bool]]:
    """The prompt text in pieces, each with whether it is an assistant message's."""
    msgs = list(messages)
    out = []
    if tools:
        system = msgs.pop(0)["content"] if msgs and msgs[0]["role"] == "system" else ""
        out.append((f"{IM_START}system\n{system}{_tools_block(tools)}{IM_END}\n", False))
    out.extend((_message_text(m), m["role"] == "assistant") for m in msgs)
    out.append((f"{IM_START}assistant\n", False))
    out.append((f"{THINK_START}\n" if thinking else f"{THINK_START}\n\n{THINK_END}\n\n", False))
    return out


def render_prompt(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]] = None,
                  thinking: bool = True) -> str:
    """Chat messages -> prompt text ending in the assistant generation prompt."""
    return "".join(text for text, _ in _pieces(messages, tools, thinking))


def assistant_spans(messages: list[dict[str, Any]],
                    tools: Optional[list[dict[str, Any]]] = None) -> list[tuple[int, int]]:
    """[start, end) in render_prompt(messages, tools) of each assistant message's part the
    model writes: its content and tool calls through ``<|im_end|>`` (the header and the
    newline after are the template's)."""
    spans, at, head = [], 0, len(f"{IM_START}assistant\n")
    for text, is_assistant in _pieces(messages, tools, True):
        if is_assistant:
            spans.append((at + head, at + len(text) - 1))
        at += len(text)
    return spans


PROBES = ("\x00", "\x01")  # two, so a text that holds one still diverges at the other


def _diverge(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def probed_assistant_spans(render: Callable[..., str]) -> Callable[..., list[tuple[int, int]]]:
    """assistant_spans for a template raygen cannot read (chat_template: model): each
    message's content (and reasoning, where the template keeps it) probed with a mark
    before and after it; where the rendering diverges is where the text lies. Tool calls
    the template writes after the content and its end-of-turn token are outside the span."""
    def spans(messages: list[dict[str, Any]],
              tools: Optional[list[dict[str, Any]]] = None) -> list[tuple[int, int]]:
        full, out = render(messages, tools), []
        for i, msg in enumerate(messages):
            if msg.get("role") != "assistant":
                continue
            starts, ends = [], []
            for field in ("content", "reasoning_content"):
                if field == "reasoning_content" and not msg.get(field):
                    continue
                text = msg.get(field) or ""
                at = [_diverge(full, render(_with(messages, i, field, p + text), tools))
                      for p in PROBES]
                to = [_diverge(full, render(_with(messages, i, field, text + p), tools))
                      for p in PROBES]
                if min(at) < len(full):  # the template renders this field
                    starts.append(min(at))
                    ends.append(min(to))
            start = min(starts, default=len(full))
            out.append((start, max(ends + [start])))
        return out
    return spans


def _with(messages: list[dict[str, Any]], i: int, field: str, text: str) -> list[dict]:
    return [dict(m, **{field: text}) if j == i else m for j, m in enumerate(messages)]


TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """A reply's answer -> (its text without tool-call blocks, the calls as
    {"name", "arguments"}). A block that is not a JSON object with a name is a call
    named None (it never equals a source call)."""
    calls = []
    for body in TOOL_CALL_BLOCK.findall(text or ""):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            call = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            calls.append({"name": None, "arguments": body})
            continue
        calls.append({"name": call["name"], "arguments": call.get("arguments", {})})
    return TOOL_CALL_BLOCK.sub("", text or "").strip(), calls


def split_reasoning(text: str, think_end: str = THINK_END) -> tuple[str, str, bool]:
    """Output text -> (reasoning, answer, finished_thinking).

    Without ``think_end`` the whole text is reasoning: the model was cut (or
    stopped) while still thinking, which the report counts separately. A ``<think>``
    the model opened itself (its template did not put it in the prompt) is markup,
    not reasoning: it is dropped, as SGLang's reasoning parser does.
    """
    head, sep, tail = text.partition(think_end)
    reasoning = head.strip().removeprefix(THINK_START).strip()
    if not sep:
        return reasoning, "", False
    return reasoning, tail.strip(), True


def no_thinking(text: str) -> tuple[str, str, bool]:
    """A thinking-off row's output -> (reasoning, answer, finished_thinking): its prompt
    closed the thinking (the empty think block), so the whole output is the answer and
    its thinking counts as finished (no missing_think_end; a cut row is cut in its
    answer)."""
    return "", text.strip(), True


def model_template_renderer(model_path: str) -> Callable[..., str]:
    """The tokenizer's own chat template (``thinking``: its enable_thinking);
    transformers imported lazily."""
    from transformers import AutoTokenizer  # only on GPU nodes, where SGLang brings it
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    def render(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]] = None,
               thinking: bool = True) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=True,
                                             enable_thinking=thinking)
    return render
