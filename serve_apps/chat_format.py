"""The thinking model's text format, in one place for every engine.

- ``render_prompt``: OpenAI-style chat messages (+ optional tools) -> the prompt text,
  ChatML as Qwen3-family models use it, with thinking on (the generation prompt
  opens ``<think>``). SGLang and the simulator get the same text, so what the CPU
  tests cover is what a GPU run sends.
- ``split_reasoning``: output text -> (reasoning, answer, answer_started).
A model whose template differs can use ``chat_template: model`` (the tokenizer's own
template, loaded lazily on GPU nodes); the split stays here.
"""

from __future__ import annotations

import json
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


def _tool_calls_text(calls: list[dict[str, Any]]) -> str:
    parts = []
    for call in calls:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):  # OpenAI sends arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
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


def render_prompt(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]] = None,
                  thinking: bool = True) -> str:
    """Chat messages -> prompt text ending in the assistant generation prompt."""
    msgs = list(messages)
    out = []
    if tools:
        system = msgs.pop(0)["content"] if msgs and msgs[0]["role"] == "system" else ""
        out.append(f"{IM_START}system\n{system}{_tools_block(tools)}{IM_END}\n")
    out.extend(_message_text(m) for m in msgs)
    out.append(f"{IM_START}assistant\n")
    out.append(f"{THINK_START}\n" if thinking else f"{THINK_START}\n\n{THINK_END}\n\n")
    return "".join(out)


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


def model_template_renderer(model_path: str) -> Callable[..., str]:
    """The tokenizer's own chat template (thinking on); transformers imported lazily."""
    from transformers import AutoTokenizer  # only on GPU nodes, where SGLang brings it
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    def render(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]] = None,
               thinking: bool = True) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=True,
                                             enable_thinking=thinking)
    return render
