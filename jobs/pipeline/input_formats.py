"""Prompt rows in the shapes people have -> raygen's canonical row, before validation.

Canonical: ``{"messages": [{"role", "content", ...}], "tools", "id", "category"}`` with
OpenAI chat messages whose ``content`` is a string. Also accepted, and converted here:

- ShareGPT: ``"conversations": [{"from": "human" | "gpt" | "system" | "tool", "value"}]``
  (turns may also use role/content, as SpecForge's and speculators' files do);
- OpenAI content-part arrays: ``"content": [{"type": "text", "text": ...}, ...]``, joined
  without a separator, which is how ChatML templates (Qwen) render text parts;
- ``reasoning_content`` (a string) on earlier assistant turns, kept as given;
- rows read from HF datasets' Parquet, whose message structs carry every field of the
  column: null fields (``tool_calls: null``) are dropped, ``content`` is kept as given.

Design decisions:
- Conversion happens before the key is computed, so a ShareGPT row and its OpenAI twin
  are the same prompt and get the same key (resume and duplicate detection agree).
- A row in another known shape (Alpaca, prompt/completion, plain text, pre-tokenized)
  is rejected with a reason naming that shape and what to convert it to: guessing a
  prompt from it would generate the wrong thing silently.
- Only the shape is handled here; jobs/pipeline/validate.py still checks roles, types and order.
"""

from __future__ import annotations

from typing import Any

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "system": "system", "tool": "tool"}
# Keys a ShareGPT turn may carry besides from/value; anything else (e.g. "weight") is
# metadata of the source dataset, not part of the prompt.
TURN_KEYS = ("tool_calls", "tool_call_id", "name", "reasoning_content")
KEPT_NULL = ("content",)   # null content is meaningful (assistant turn with tool calls)

OTHER_SHAPES = [  # (fields that identify it, its name, what to do)
    (("instruction",), "Alpaca (instruction/input/output)",
     "put instruction + input in a user message"),
    (("prompt",), "prompt/completion",
     "put the prompt in messages as a user message (or its turns, if it is a list)"),
    (("input_ids",), "pre-tokenized (input_ids)", "raygen needs chat messages, not token ids"),
    (("question",), "question/answer", "put the question in a user message"),
    (("text",), "plain text", "put the text in a user message"),
]


class FormatError(ValueError):
    """The row's shape is not one raygen reads; the message names the field."""


def to_canonical(row: dict[str, Any]) -> dict[str, Any]:
    """The row with ``messages`` in canonical form (a new dict); raises FormatError."""
    has_messages = row.get("messages") is not None
    has_conversations = row.get("conversations") is not None
    if has_messages and has_conversations:
        raise FormatError("the row has both 'messages' and 'conversations' (ShareGPT); keep one")
    if not (has_messages or has_conversations):
        raise FormatError(missing_messages(row))
    field = "messages" if has_messages else "conversations"
    turns = row[field]
    out = {k: v for k, v in row.items() if k != "conversations"}
    if isinstance(turns, list):  # other types: validate.py names the problem
        turns = [_canonical_turn(field, i, t) for i, t in enumerate(turns)]
    out["messages"] = turns
    return out


def missing_messages(row: dict[str, Any]) -> str:
    for fields, name, todo in OTHER_SHAPES:
        if all(f in row for f in fields):
            return (f"missing 'messages': this row looks like {name}; {todo} "
                    f"(see docs/rows-and-schema.md 'Prompt rows')")
    return "missing 'messages' (or ShareGPT 'conversations')"


def _canonical_turn(field: str, i: int, turn: Any) -> Any:
    if not isinstance(turn, dict):
        return turn
    where = f"{field}[{i}]"
    if "from" in turn and "role" not in turn:
        turn = _from_sharegpt(where, turn)
    msg = {k: v for k, v in turn.items() if v is not None or k in KEPT_NULL}
    if isinstance(msg.get("content"), list):
        msg["content"] = _join_text_parts(where, msg["content"])
    reasoning = msg.get("reasoning_content")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise FormatError(f"{where}.reasoning_content must be a string, got "
                              f"{type(reasoning).__name__}")
        if msg.get("role") != "assistant":
            raise FormatError(f"{where}.reasoning_content is only allowed on assistant turns")
    return msg


def _from_sharegpt(where: str, turn: dict[str, Any]) -> dict[str, Any]:
    speaker = turn["from"]
    if speaker not in SHAREGPT_ROLES:
        raise FormatError(f"{where}.from {speaker!r} is not a ShareGPT speaker "
                          f"({', '.join(SHAREGPT_ROLES)})")
    if "value" not in turn:
        raise FormatError(f"{where} has 'from' but no 'value' (ShareGPT turn)")
    msg = {"role": SHAREGPT_ROLES[speaker], "content": turn["value"]}
    msg.update({k: turn[k] for k in TURN_KEYS if turn.get(k) is not None})
    return msg


def _join_text_parts(where: str, parts: list[Any]) -> str:
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise FormatError(f"{where}.content[{j}]: part type {kind!r} is not supported "
                              f"(text parts only)")
        if not isinstance(part.get("text"), str):
            raise FormatError(f"{where}.content[{j}].text must be a string")
        texts.append(part["text"])
    return "".join(texts)
