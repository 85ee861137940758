"""Validate raw prompt rows and give each a stable key (stage 2 of the job).

Row contract: reads ``source, line, ordinal, raw, problem`` (``VALIDATE_INPUTS``,
checked per batch: jobs/pipeline/stage_inputs.py); adds ``key, id, category, messages,
tools, prompt_hash`` (messages/tools re-serialised as canonical JSON) and
``reject_reason`` (None when valid).

Any line is a verdict: ``parse_row`` returns a row or raises RowError with a reason,
whatever the text (a reader ``problem`` such as bytes that are not UTF-8; JSON nested
deeper than MAX_DEPTH; a number past Python's digit limit; NaN; a lone surrogate such as
the half of an emoji an exporter cut; a NUL character), so the admission pass and
``--dry-run`` never raise on input (tests/unit/jobs/pipeline/test_any_line.py fuzzes it). The driver's admission pass (jobs/pipeline/admission.py)
uses the same ``parse_row`` and writes the rejects; the admit filter drops them here.

Key rule (docs/rows-and-schema.md "Row keys"): a string ``id`` is the key as is (it is
data, never a path); an integer ``id`` n is the key ``int:n`` (so ``1`` and ``"1"`` never
collide); without an id the key is ``sha256:`` + a hash of the canonical prompt
(messages + tools). Canonical means keys sorted and null-valued fields dropped, so a prompt keeps
its key when re-exported (explicit nulls vs absent keys, key order, JSONL vs Parquet).
String ids starting with a reserved prefix (``int:``, ``sha256:``) are rejected: they
could collide with a generated key. ``prompt_hash`` hashes the canonical prompt of every
valid row (with or without id) so a resume can tell a prompt edited under its id.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Optional

import pyarrow as pa

from jobs.pipeline.input_formats import FormatError, to_canonical
from jobs.pipeline.stage_inputs import StageInputs

ROLES = ("system", "user", "assistant", "tool")
VALIDATED = pa.schema([
    ("source", pa.string()), ("line", pa.int64()), ("ordinal", pa.int64()),
    ("raw", pa.string()), ("key", pa.string()), ("id", pa.string()), ("category", pa.string()),
    ("messages", pa.string()), ("tools", pa.string()), ("prompt_hash", pa.string()),
    ("reject_reason", pa.string()),
])
# What the read (jobs/io/sources.py RAW_SCHEMA) gives each line.
VALIDATE_INPUTS = StageInputs("validate", {
    "source": "the input file's URI", "line": "the line number in it",
    "ordinal": "the line's place in the whole input", "raw": "the line's text",
    "problem": "what the reader found wrong with its bytes, or null"})
RESERVED_PREFIXES = ("int:", "sha256:")
# Deeper JSON is refused before it is parsed: every recursive step after (json's C
# parser, canonicalising, hashing) then stays far from Python's recursion limit, in the
# driver and in a Ray worker alike, so both reach the same verdict.
MAX_DEPTH = 200
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")  # the escape itself, not an escaped backslash + "u0000"


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


def nesting_depth(raw: str) -> int:
    """How deep the JSON text nests arrays and objects (brackets inside strings ignored)."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRING.sub("", raw)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _not_json_constant(name: str) -> Any:
    raise RowError(f"{name} is not a JSON value (write numbers as numbers, or null)")


def _loads(raw: str) -> Any:
    if raw.count("[") + raw.count("{") > MAX_DEPTH and nesting_depth(raw) > MAX_DEPTH:
        raise RowError(f"JSON nested {nesting_depth(raw)} levels deep; at most {MAX_DEPTH} "
                       f"are read")
    try:
        return json.loads(raw, parse_constant=_not_json_constant)
    except json.JSONDecodeError as exc:
        raise RowError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError as exc:  # int digit limit: "Exceeds the limit (4300 digits) ..."
        raise RowError(f"not readable JSON: {exc}") from None


def _text_problem(text: str) -> Optional[str]:
    """Why a canonical JSON text cannot be sent or stored as is, or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        at = text[max(0, exc.start - 30):exc.start]
        return (f"contains a lone surrogate \\u{ord(text[exc.start]):04x} after {at!r} (an "
                f"emoji or other character cut in half, e.g. by an exporter): fix the line")
    if "\\u0000" in text and _NUL.search(text):  # json.dumps writes NUL as the escape
        return "contains a NUL character (\\u0000), which the model's tokenizer cannot take"
    return None


def parse_row(raw: str, problem: Optional[str] = None) -> dict[str, Any]:
    """raw line -> {key, id, category, messages, tools, prompt_hash}; raises RowError.

    ``problem``: what the reader found wrong with the line's bytes (jobs/io/sources.py)."""
    if problem:
        raise RowError(problem)
    try:
        return _parse(raw)
    except RowError:
        raise
    except Exception as exc:  # noqa: BLE001 - a row must end as a verdict, never a crash
        raise RowError(f"cannot read this row ({type(exc).__name__}: {exc})") from None


def _parse(raw: str) -> dict[str, Any]:
    row = _loads(raw)
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
    texts = {"messages": canonical_json(messages),  # as given: the engine sees the export's fields
             "tools": canonical_json(tools) if tools else None,
             "id": row_id, "category": category}
    for name, text in texts.items():
        trouble = text is not None and _text_problem(text)
        if trouble:
            raise RowError(f"{name} {trouble}")
    phash = prompt_key(messages, tools or None)
    return {"key": key if key is not None else phash,
            "id": row_id, "category": category or "none",
            "messages": texts["messages"], "tools": texts["tools"], "prompt_hash": phash}


def validate_batch(batch: pa.Table) -> pa.Table:
    VALIDATE_INPUTS.check(batch)
    cols: dict[str, list] = {name: [] for name in VALIDATED.names}
    for source, line, ordinal, raw, problem in zip(*(
            batch.column(c).to_pylist() for c in ("source", "line", "ordinal", "raw", "problem"))):
        try:
            parsed, reason = parse_row(raw, problem), None
        except RowError as exc:
            parsed, reason = {}, str(exc)
        for name, value in (("source", source), ("line", line), ("ordinal", ordinal),
                            ("raw", raw),
                            ("reject_reason", reason)):
            cols[name].append(value)
        for name in ("key", "id", "category", "messages", "tools", "prompt_hash"):
            cols[name].append(parsed.get(name))
    return pa.table(cols, schema=VALIDATED)
