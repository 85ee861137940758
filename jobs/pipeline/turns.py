"""Every-turn regeneration (job.regenerate every_turn): a conversation's turns, one round each.

A source conversation (the row's ``messages``, kept as given: it is the row's identity)
has K assistant turns to generate: each assistant message it holds, then the reply to its
last message. Turn k (1-based) is generated on the source's messages before its k-th
assistant message, with assistant turns 1..k-1 replaced by the model's own (built here,
``prompt_messages``); system, user and tool messages stay the source's.

An earlier turn goes into the history as the model's template takes it: content, tool
calls and ``reasoning_content``; the renderer decides what it keeps (raygen's builtin
ChatML drops earlier reasoning, as Qwen3's template does; ``chat_template: model`` gets
the tokenizer's own rule). A turn that made tool calls is kept with the source's calls
(their ids, which the source's tool results answer) only when it made the same calls
(names and arguments, in order): the source's tool results then answer it. Otherwise the
conversation stops after that turn (``tool_calls_differ``): results of calls the model
did not make would put off-policy text in its history. A turn cut by length stops it too
(``length``), and a permanent error of a later round (``error:<class>``); ``complete``
once all K turns are regenerated. ``turn_stop`` None = more turns to go.

Each round writes the row's next version holding every turn so far (``turns``, schema
TURN); the row's own result columns are its last turn's, so everything that reads a row
(report, continuation, integrity) reads the conversation's latest turn.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from contract.protocol import GenerateResult
from serve_apps.chat_format import normalized_call, parse_tool_calls

COMPLETE, LENGTH, TOOL_CALLS_DIFFER = "complete", "length", "tool_calls_differ"
ERROR = "error:"  # + the error class of a round's permanent failure


def assistant_positions(source: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(source) if m.get("role") == "assistant"]


def turn_count(source: list[dict[str, Any]]) -> int:
    """K: the source's assistant messages, then the reply to its last message (validated
    to be a user or tool message)."""
    return len(assistant_positions(source)) + 1


def history_message(turn: dict[str, Any], source_msg: dict[str, Any]) -> dict[str, Any]:
    """A regenerated turn as the assistant message of a later turn's prompt."""
    msg = {"role": "assistant", "content": turn["answer"] or "",
           "reasoning_content": turn["reasoning"] or ""}
    if source_msg.get("tool_calls"):  # same calls (stop_after checked): the source's ids
        msg["content"] = parse_tool_calls(turn["answer"])[0]
        msg["tool_calls"] = source_msg["tool_calls"]
    return msg


def prompt_messages(source: list[dict[str, Any]],
                    turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages turn len(turns) + 1 is generated on."""
    positions = assistant_positions(source)
    k = len(turns)
    if k >= len(positions) + 1:
        raise ValueError(f"the conversation has {len(positions) + 1} turns; all are done")
    end = positions[k] if k < len(positions) else len(source)
    done = iter(turns)
    return [history_message(next(done), m) if m.get("role") == "assistant" else m
            for m in source[:end]]


def conversation(source: list[dict[str, Any]],
                 turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The regenerated conversation: the source through its last regenerated turn, every
    assistant turn the model's (the last one as it was written, tool calls included)."""
    messages = prompt_messages(source, turns[:-1])
    last = turns[-1]
    messages.append({"role": "assistant", "content": last["answer"] or "",
                     "reasoning_content": last["reasoning"] or ""})
    return messages


def _calls(tool_calls: Optional[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [normalized_call(call) for call in tool_calls or ()]


def same_calls(source_calls: Optional[list[dict[str, Any]]],
               made: list[dict[str, Any]]) -> bool:
    return _calls(source_calls) == made


def stop_after(source: list[dict[str, Any]], turns: list[dict[str, Any]]) -> Optional[str]:
    """Why the conversation ends after its latest turn (None: generate the next)."""
    last, k = turns[-1], len(turns)
    if last["finish_reason"] == "length":
        return LENGTH
    if k >= turn_count(source):
        return COMPLETE
    source_msg = source[assistant_positions(source)[k - 1]]
    if not same_calls(source_msg.get("tool_calls"), parse_tool_calls(last["answer"])[1]):
        return TOOL_CALLS_DIFFER
    return None


def new_turn(result: GenerateResult) -> dict[str, Any]:
    """The turn a result generated (schema TURN; its span is the row's output)."""
    calls = parse_tool_calls(result.answer or "")[1]
    return {"reasoning": result.reasoning, "answer": result.answer,
            "tool_calls": json.dumps(calls, ensure_ascii=False) if calls else None,
            "finished_thinking": result.finished_thinking,
            "finish_reason": result.finish_reason, "matched_stop": result.matched_stop,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "cached_tokens": result.cached_tokens,
            "output_token_ids": list(result.output_token_ids or ()),
            "latency_s": result.latency_s, "replica": result.replica,
            "span_start": None, "span_end": None}


def with_turn(out: dict[str, Any], earlier: list[dict[str, Any]], result: GenerateResult,
              source: list[dict[str, Any]]) -> dict[str, Any]:
    """A data row (rows.data_row of the result) given every turn so far: the earlier
    turns with their spans in this prompt (the replica's assistant_spans), the new one,
    and why the conversation stops, if it does."""
    spans = result.assistant_spans or []
    if len(spans) != len(earlier):
        raise ValueError(f"key {out['key']!r}: the replica found {len(spans)} assistant "
                         f"turns in the prompt, the row holds {len(earlier)}")
    turns = [dict(t, span_start=s, span_end=e) for t, (s, e) in zip(earlier, spans)]
    turns.append(new_turn(result))
    out.update(turns=turns, turn_stop=stop_after(source, turns))
    return out


def loss_spans(prompt_len: int, output_len: int,
               turns: Optional[list[dict[str, Any]]]) -> list[tuple[int, int]]:
    """[start, end) of every assistant turn in prompt ids + output ids: the earlier turns'
    spans in the prompt, then the output (a row without turns: the output alone)."""
    spans = [(t["span_start"], t["span_end"]) for t in (turns or [])[:-1]
             if t["span_start"] is not None]
    return spans + [(prompt_len, prompt_len + output_len)]


def loss_mask(prompt_len: int, output_len: int,
              turns: Optional[list[dict[str, Any]]]) -> list[int]:
    mask = [0] * (prompt_len + output_len)
    for start, end in loss_spans(prompt_len, output_len, turns):
        mask[start:end] = [1] * (end - start)
    return mask
