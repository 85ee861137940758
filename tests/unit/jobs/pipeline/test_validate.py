"""jobs.pipeline.validate: every reject reason names its field; keys are stable."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from jobs.pipeline.validate import VALIDATED, RowError, parse_row, validate_batch

USER = {"role": "user", "content": "hi"}


def row(**fields) -> str:
    fields.setdefault("messages", [USER])
    return json.dumps(fields)


def reason(raw: str) -> str:
    with pytest.raises(RowError) as info:
        parse_row(raw)
    return str(info.value)


@pytest.mark.parametrize("raw, expected", [
    ('{"messages": [', "not valid JSON"),
    ("not json at all", "not valid JSON"),
    ('[{"role": "user"}]', "a row must be a JSON object, got list"),
    ('"hello"', "a row must be a JSON object, got str"),
    ("42", "a row must be a JSON object, got int"),
    ("null", "a row must be a JSON object, got NoneType"),
    ('{"prompt": "hi"}', "missing 'messages'"),
    ('{"messages": null}', "missing 'messages'"),
    ('{"messages": "hi"}', "'messages' must be a list, got str"),
    ('{"messages": {"role": "user"}}', "'messages' must be a list, got dict"),
    ('{"messages": []}', "'messages' is empty"),
    ('{"messages": ["hi"]}', "messages[0] must be an object, got str"),
    ('{"messages": [{"role": "user", "content": "a"}, 5]}', "messages[1] must be an object, got int"),
    ('{"messages": [{"role": "human", "content": "a"}]}', "messages[0].role 'human' is not one of"),
    ('{"messages": [{"content": "a"}]}', "messages[0].role None is not one of"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
     "messages[0].content[0]: part type 'image_url' is not supported"),  # text parts: joined
    ('{"messages": [{"role": "user", "content": 7}]}', "messages[0].content must be a string, got int"),
    ('{"messages": [{"role": "user"}]}', "messages[0].content must be a string, got NoneType"),
    ('{"messages": [{"role": "assistant", "content": null}, {"role": "user", "content": "a"}]}',
     "messages[0].content must be a string, got NoneType"),
    ('{"messages": [{"role": "assistant", "content": "x", "tool_calls": {"name": "f"}}, '
     '{"role": "user", "content": "a"}]}', "messages[0].tool_calls must be a list"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
     "the last message must be from user or tool to prompt a reply, got 'assistant'"),
    ('{"messages": [{"role": "system", "content": "s"}]}',
     "the last message must be from user or tool"),
    ('{"messages": [{"role": "user", "content": "a"}], "tools": {"name": "f"}}',
     "'tools' must be a list of objects"),
    ('{"messages": [{"role": "user", "content": "a"}], "tools": ["f"]}',
     "'tools' must be a list of objects"),
    ('{"messages": [{"role": "user", "content": "a"}], "category": 3}',
     "category must be a string, got int"),
    ('{"messages": [{"role": "user", "content": "a"}], "id": 1.5}',
     "id must be a string or integer, got float"),
    ('{"messages": [{"role": "user", "content": "a"}], "id": [1]}',
     "id must be a string or integer, got list"),
    ('{"messages": [{"role": "user", "content": "a"}], "id": true}',
     "id must be a string or integer, got bool"),
    ('{"messages": [{"role": "user", "content": "a"}], "id": {"a": 1}}',
     "id must be a string or integer, got dict"),
    ('{"messages": [{"role": "user", "content": "a"}], "id": ""}', "id is empty"),
    ('{"messages": [{"role": "user", "content": "a"}], "id": "   "}', "id is empty"),
])
def test_reject_reasons(raw, expected):
    assert expected in reason(raw)


def test_json_error_names_column():
    assert "at column 15" in reason('{"messages": [,]}')


def test_assistant_tool_calls_with_null_content_is_valid():
    raw = json.dumps({"messages": [
        USER,
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ], "tools": [{"type": "function", "function": {"name": "f"}}]})
    out = parse_row(raw)
    assert out["key"].startswith("sha256:")
    assert json.loads(out["messages"])[1]["content"] is None
    assert json.loads(out["tools"]) == [{"type": "function", "function": {"name": "f"}}]


def test_assistant_null_content_with_non_list_tool_calls_rejected():
    # Must be rejected like the string-content case: render_prompt would iterate the
    # string and crash in the generate stage instead of producing a reject.
    raw = json.dumps({"messages": [
        USER, {"role": "assistant", "content": None, "tool_calls": "f(x)"},
        {"role": "tool", "content": "r"}]})
    assert "messages[1].tool_calls must be a list" in reason(raw)


def test_null_tool_calls_on_plain_message_is_valid():
    # OpenAI exports and Parquet struct columns carry "tool_calls": null on messages
    # without calls; that is "no calls", not a malformed field.
    raw = json.dumps({"messages": [{"role": "user", "content": "hi", "tool_calls": None}]})
    assert parse_row(raw)["key"].startswith("sha256:")


def test_valid_row_fields():
    out = parse_row(json.dumps({"id": "p-1", "category": "math", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]}))
    assert out["key"] == "p-1" and out["id"] == "p-1"
    assert out["category"] == "math"
    assert out["messages"] == ('[{"content":"be brief","role":"system"},'
                               '{"content":"2+2?","role":"user"}]')
    assert out["tools"] is None


def test_last_message_tool_is_valid():
    parse_row(json.dumps({"messages": [USER, {"role": "tool", "content": "r"}]}))


def test_category_defaults_to_none_label():
    assert parse_row(row())["category"] == "none"
    assert parse_row(row(category=None))["category"] == "none"


def test_id_is_data_not_a_path():
    out = parse_row(row(id="../../etc/passwd"))
    assert out["key"] == "../../etc/passwd"
    assert out["id"] == "../../etc/passwd"


def test_integer_id_is_a_typed_key():
    # id 17 and id "17" are different rows: the integer's key is tagged
    out = parse_row(row(id=17))
    assert out["key"] == "int:17" and out["id"] == "17"
    assert parse_row(row(id="17"))["key"] == "17"


@pytest.mark.parametrize("value", ["int:17", "sha256:1e310e19a25fc41952488207bc9bcf22"])
def test_string_id_with_a_reserved_prefix_is_rejected(value):
    assert f"id {value!r} starts with a reserved prefix" in reason(row(id=value))


def test_key_ignores_null_fields_and_key_order():
    # what a Parquet export adds (every struct field, null when unset) changes nothing
    plain = parse_row(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    nulls = parse_row(json.dumps({"tools": None, "messages": [
        {"content": "hi", "role": "user", "name": None, "tool_calls": None}], "id": None}))
    assert plain["key"] == nulls["key"] == plain["prompt_hash"] == nulls["prompt_hash"]


def test_prompt_hash_is_set_with_an_id_too_and_follows_the_prompt():
    a, b = parse_row(row(id="k")), parse_row(row(id="k", messages=[
        {"role": "user", "content": "edited"}]))
    assert a["key"] == b["key"] == "k"
    assert a["prompt_hash"].startswith("sha256:") and a["prompt_hash"] != b["prompt_hash"]


def test_null_id_means_hash_key():
    out = parse_row(row(id=None))
    assert out["id"] is None and out["key"].startswith("sha256:")


def test_hash_key_shape_and_stable_across_key_order():
    a = '{"messages": [{"role": "user", "content": "hi"}], "category": "x"}'
    b = '{"category": "x", "messages": [{"content": "hi", "role": "user"}]}'
    ka, kb = parse_row(a)["key"], parse_row(b)["key"]
    assert ka == kb
    assert ka.startswith("sha256:") and len(ka) == len("sha256:") + 32
    int(ka[len("sha256:"):], 16)


def test_hash_key_ignores_category_but_not_content_or_tools():
    base = parse_row(row())["key"]
    assert parse_row(row(category="other"))["key"] == base
    assert parse_row(row(messages=[{"role": "user", "content": "hi!"}]))["key"] != base
    t1 = [{"type": "function", "function": {"name": "a"}}]
    t2 = [{"type": "function", "function": {"name": "b"}}]
    k1, k2 = parse_row(row(tools=t1))["key"], parse_row(row(tools=t2))["key"]
    assert len({base, k1, k2}) == 3


def test_empty_tools_list_is_no_tools():
    assert parse_row(row(tools=[]))["key"] == parse_row(row())["key"]
    assert parse_row(row(tools=[]))["tools"] is None


def test_hash_key_is_pinned():
    # Resume across releases depends on it: sha256 of the canonical
    # {"messages": ..., "tools": ...} JSON, first 32 hex digits.
    assert parse_row(row())["key"] == "sha256:1e310e19a25fc41952488207bc9bcf22"


def test_non_ascii_kept_in_canonical_json():
    out = parse_row(row(messages=[{"role": "user", "content": "héllo 世界"}]))
    assert "héllo 世界" in out["messages"]


def test_validate_batch_keeps_place_and_marks_only_bad_rows():
    raws = [row(id="a"), "{broken", row(messages=[]), row()]
    batch = pa.table({"source": ["s3://b/p.jsonl"] * 4, "line": [1, 2, 5, 9],
                      "ordinal": [1, 2, 5, 9], "raw": raws, "problem": [None] * 4})
    out = validate_batch(batch)
    assert out.schema == VALIDATED
    rows = out.to_pylist()
    assert [r["source"] for r in rows] == ["s3://b/p.jsonl"] * 4
    assert [r["line"] for r in rows] == [1, 2, 5, 9]
    assert [r["raw"] for r in rows] == raws
    assert rows[0]["reject_reason"] is None and rows[0]["key"] == "a"
    assert rows[1]["reject_reason"].startswith("not valid JSON")
    assert rows[1]["key"] is None and rows[1]["messages"] is None
    assert rows[2]["reject_reason"] == "'messages' is empty"
    assert rows[3]["reject_reason"] is None and rows[3]["key"].startswith("sha256:")
    assert rows[3]["category"] == "none"


def test_validate_batch_empty():
    batch = pa.table({"source": pa.array([], pa.string()), "line": pa.array([], pa.int64()),
                      "ordinal": pa.array([], pa.int64()), "raw": pa.array([], pa.string()),
                      "problem": pa.array([], pa.string())})
    out = validate_batch(batch)
    assert out.num_rows == 0 and out.schema == VALIDATED
