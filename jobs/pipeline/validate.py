"""Validate raw prompt rows and give each a stable key (stage 2 of the job).

Row contract: reads ``source, line, ordinal, raw``; adds ``key, id, category, messages,
tools, prompt_hash`` (messages/tools re-serialised as canonical JSON) and
``reject_reason`` (None when valid). The driver's admission pass (jobs/pipeline/admission.py)
uses the same ``parse_row`` and writes the rejects; the admit filter drops them here.

Key rule (README "Row keys"): a string ``id`` is the key as is (it is data, never a
path); an integer ``id`` n is the key ``int:n`` (so ``1`` and ``"1"`` never collide);
without an id the key is ``sha256:`` + a hash of the canonical prompt (messages +
tools). Canonical means keys sorted and null-valued fields dropped, so a prompt keeps
its key when re-exported (explicit nulls vs absent keys, key order, JSONL vs Parquet).
String ids starting with a reserved prefix (``int:``, ``sha256:``) are rejected: they
could collide with a generated key. ``prompt_hash`` hashes the canonical prompt of every
valid row (with or without id) so a resume can tell a prompt edited under its id.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

import pyarrow as pa

from jobs.pipeline.input_formats import FormatError, to_canonical

ROLES = ("system", "user", "assistant", "tool")
VALIDATED = pa.schema([
    ("source", pa.string()), ("line", pa.int64()), ("ordinal", pa.int64()),
    ("raw", pa.string()), ("key", pa.string()), ("id", pa.string()), ("category", pa.string()),
    ("messages", pa.string()), ("tools", pa.string()), ("prompt_hash", pa.string()),
    ("reject_reason", pa.string()),
])
RESERVED_PREFIXES = ("int:", "sha256:")


class RowError(ValueError):
    """The row is invalid; the message names the field."""


def canonical_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def drop_nulls(value: Any) -> Any:
    """The same prompt whether an exporter wrote ``"name": null`` or left the key out."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def prompt_key(messages: list[dict], tools: Optional[list[dict]]) -> str:
    """Hash of the canonical prompt: the key of a row without id, and its prompt_hash."""
    canonical = {"messages": drop_nulls(messages), "tools": drop_nulls(tools) or None}
    digest = hashlib.sha256(canonical_json(canonical).encode())
    return "sha256:" + digest.hexdigest()[:32]


def _check_message(i: int, msg: Any) -> None:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise RowError(f"{where} must be an object, got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise RowError(f"{where}.role {role!r} is not one of {', '.join(ROLES)}")
    content, tool_calls = msg.get("content"), msg.get("tool_calls")
    # tool_calls=None is normal: Parquet struct columns give every message the field.
    if tool_calls is not None and not (isinstance(tool_calls, list)
                                       and all(isinstance(c, dict) for c in tool_calls)):
        raise RowError(f"{where}.tool_calls must be a list of objects")
    if content is None and role == "assistant" and tool_calls:
        return
    if not isinstance(content, str):
        raise RowError(f"{where}.content must be a string, got {type(content).__name__}")


def _check_id(row: dict) -> tuple[Optional[str], Optional[str]]:
    """(id as text, key) from the row's id; (None, None) when it has none."""
    if "id" not in row or row["id"] is None:
        return None, None
    value = row["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RowError(f"id must be a string or integer, got {type(value).__name__}")
    if isinstance(value, int):
        return str(value), f"int:{value}"  # typed: id 1 and id "1" are different rows
    if not value.strip():
        raise RowError("id is empty")
    if value.startswith(RESERVED_PREFIXES):
        raise RowError(f"id {value[:80]!r} starts with a reserved prefix "
                       f"({' or '.join(RESERVED_PREFIXES)}): it could collide with a "
                       f"generated key; rename it")
    return value, value


def parse_row(raw: str) -> dict[str, Any]:
    """raw line -> {key, id, category, messages, tools, prompt_hash}; raises RowError."""
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RowError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(row, dict):
        raise RowError(f"a row must be a JSON object, got {type(row).__name__}")
    try:  # ShareGPT, content parts, HF Parquet nulls -> canonical messages, before the key
        row = to_canonical(row)
    except FormatError as exc:
        raise RowError(str(exc)) from None
    messages = row.get("messages")
    if messages is None:
        raise RowError("missing 'messages'")
    if not isinstance(messages, list):
        raise RowError(f"'messages' must be a list, got {type(messages).__name__}")
    if not messages:
        raise RowError("'messages' is empty")
    for i, msg in enumerate(messages):
        _check_message(i, msg)
    if messages[-1]["role"] not in ("user", "tool"):
        raise RowError(f"the last message must be from user or tool to prompt a reply, "
                       f"got {messages[-1]['role']!r}")
    tools = row.get("tools")
    if tools is not None and (not isinstance(tools, list)
                              or not all(isinstance(t, dict) for t in tools)):
        raise RowError("'tools' must be a list of objects")
    category = row.get("category")
    if category is not None and not isinstance(category, str):
        raise RowError(f"category must be a string, got {type(category).__name__}")
    row_id, key = _check_id(row)
    phash = prompt_key(messages, tools or None)
    return {"key": key if key is not None else phash,
            "id": row_id, "category": category or "none",
            "messages": canonical_json(messages),  # as given: the engine sees the export's fields
            "tools": canonical_json(tools) if tools else None,
            "prompt_hash": phash}


def validate_batch(batch: pa.Table) -> pa.Table:
    cols: dict[str, list] = {name: [] for name in VALIDATED.names}
    for source, line, ordinal, raw in zip(*(batch.column(c).to_pylist()
                                            for c in ("source", "line", "ordinal", "raw"))):
        try:
            parsed, reason = parse_row(raw), None
        except RowError as exc:
            parsed, reason = {}, str(exc)
        for name, value in (("source", source), ("line", line), ("ordinal", ordinal),
                            ("raw", raw),
                            ("reject_reason", reason)):
            cols[name].append(value)
        for name in ("key", "id", "category", "messages", "tools", "prompt_hash"):
            cols[name].append(parsed.get(name))
    return pa.table(cols, schema=VALIDATED)
