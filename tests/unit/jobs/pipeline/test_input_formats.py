"""jobs.pipeline.input_formats through jobs.pipeline.validate: the prompt shapes people have become one
canonical row, twins share a key, and rows in another known shape say which."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.config import StorageConfig
from jobs.io.sources import iter_parquet_rows
from jobs.io.storage import locate
from jobs.pipeline.validate import RowError, parse_row

OPENAI = {"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "What is 2+2?"},
                       {"role": "assistant", "content": "4"},
                       {"role": "user", "content": "And 3+3?"}]}
SHAREGPT = {"conversations": [{"from": "system", "value": "Be brief."},
                              {"from": "human", "value": "What is 2+2?"},
                              {"from": "gpt", "value": "4", "weight": 0},
                              {"from": "human", "value": "And 3+3?"}]}


def reason(row: dict) -> str:
    with pytest.raises(RowError) as info:
        parse_row(json.dumps(row))
    return str(info.value)


def test_sharegpt_row_and_its_openai_twin_get_the_same_key_and_messages():
    sharegpt, openai = parse_row(json.dumps(SHAREGPT)), parse_row(json.dumps(OPENAI))
    assert sharegpt["key"] == openai["key"] and sharegpt["key"].startswith("sha256:")
    assert sharegpt["messages"] == openai["messages"]
    assert json.loads(sharegpt["messages"])[2] == {"role": "assistant", "content": "4"}


def test_conversations_with_role_content_turns_are_read_too():
    row = {"conversations": OPENAI["messages"]}
    assert parse_row(json.dumps(row))["key"] == parse_row(json.dumps(OPENAI))["key"]


def test_openai_text_parts_are_joined_like_the_chat_template_does():
    parts = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]}]}
    plain = {"messages": [{"role": "user", "content": "What is 2+2?"}]}
    assert parse_row(json.dumps(parts)) == parse_row(json.dumps(plain))


def test_reasoning_content_on_an_earlier_assistant_turn_is_kept():
    row = {"messages": [{"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
                        {"role": "user", "content": "Bye"}]}
    assert json.loads(parse_row(json.dumps(row))["messages"])[1]["reasoning_content"] == "greet"


def test_hf_parquet_rows_with_null_struct_fields_match_their_jsonl_twin(tmp_path):
    # An HF dataset's messages column is list<struct>: every message carries every field.
    table = pa.Table.from_pylist([{"messages": [
        {"role": "user", "content": "Hi", "tool_calls": None, "reasoning_content": None}]}])
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(table, path)
    [(line, raw, _)] = list(iter_parquet_rows(locate(str(path), StorageConfig())))
    assert line == 1
    twin = {"messages": [{"role": "user", "content": "Hi"}]}
    assert parse_row(raw) == parse_row(json.dumps(twin))


@pytest.mark.parametrize("row, expected", [
    ({"instruction": "Add", "input": "2 2", "output": "4"},
     "missing 'messages': this row looks like Alpaca"),
    ({"prompt": "hi", "completion": "hello"}, "missing 'messages': this row looks like "
                                              "prompt/completion"),
    ({"text": "once upon a time"}, "looks like plain text"),
    ({"input_ids": [1, 2], "loss_mask": [0, 1]}, "looks like pre-tokenized"),
    ({"question": "why?", "answer": "because"}, "looks like question/answer"),
    ({"id": "x"}, "missing 'messages' (or ShareGPT 'conversations')"),
    ({"messages": OPENAI["messages"], "conversations": SHAREGPT["conversations"]},
     "both 'messages' and 'conversations'"),
    ({"conversations": [{"from": "bard", "value": "hi"}]},
     "conversations[0].from 'bard' is not a ShareGPT speaker"),
    ({"conversations": [{"from": "human"}]}, "conversations[0] has 'from' but no 'value'"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0]: part type 'image_url' is not supported (text parts only)"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "messages[0].content[0].text must be a string"),
    ({"messages": [{"role": "user", "content": ["hi"]}]},
     "messages[0].content[0]: part type 'str' is not supported"),
    ({"messages": [{"role": "user", "content": "hi", "reasoning_content": "x"}]},
     "messages[0].reasoning_content is only allowed on assistant turns"),
    ({"messages": [{"role": "assistant", "content": "a", "reasoning_content": 1},
                   {"role": "user", "content": "b"}]},
     "messages[0].reasoning_content must be a string, got int"),
])
def test_rows_of_other_shapes_are_rejected_naming_the_shape(row, expected):
    assert expected in reason(row)


def test_sharegpt_rows_still_go_through_message_validation():
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    assert "the last message must be from user or tool" in reason(row)


def test_the_documented_prompt_row_example_is_a_valid_row():
    doc = (Path(__file__).resolve().parents[4] / "docs" / "rows-and-schema.md").read_text()
    example = doc.split("## Prompt rows")[1].split("```json")[1].split("```")[0]
    parsed = parse_row(json.dumps(json.loads(example)))
    assert parsed["key"] == "q-000017" and json.loads(parsed["tools"])
