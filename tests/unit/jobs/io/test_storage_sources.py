"""jobs.io.storage (atomic writes, listing, URIs) and jobs.io.sources (line numbering)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.io import sources
from jobs.config import StorageConfig
from jobs.io.sources import (READ_CHUNK_BYTES, _blocks, count_rows, iter_jsonl_lines,
                          iter_parquet_rows, iter_rows)
from jobs.io.storage import (is_local, list_files, locate, read_bytes, read_json,
                          write_bytes_atomic, write_json_atomic)
from jobs.pipeline.validate import RowError, parse_row

STORAGE = StorageConfig()


# --- storage ----------------------------------------------------------------------------

def test_locate_local_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loc = locate("runs/demo", STORAGE)
    assert is_local(loc)
    assert loc.path == os.path.join(str(tmp_path), "runs", "demo")
    assert loc.uri == "runs/demo"
    child = loc.join("data", "part-0.parquet")
    assert child.path == os.path.join(loc.path, "data", "part-0.parquet")
    assert child.uri == "runs/demo/data/part-0.parquet"


@pytest.mark.parametrize("uri", ["gs://bucket/x", "file:///tmp/x", "http://host/x"])
def test_locate_rejects_other_schemes(uri):
    with pytest.raises(ValueError) as info:
        locate(uri, STORAGE)
    assert repr(uri) in str(info.value) and "s3://" in str(info.value)


def test_locate_s3_strips_scheme_and_slash():
    loc = locate("s3://bucket/runs/", StorageConfig(endpoint_url="http://127.0.0.1:1"))
    assert not is_local(loc)
    assert loc.path == "bucket/runs"
    assert loc.uri == "s3://bucket/runs"


def test_write_bytes_atomic_creates_parents_and_leaves_no_temp(tmp_path):
    loc = locate(str(tmp_path / "a" / "b" / "file.bin"), STORAGE)
    write_bytes_atomic(loc, b"first")
    assert (tmp_path / "a" / "b" / "file.bin").read_bytes() == b"first"
    assert os.listdir(tmp_path / "a" / "b") == ["file.bin"]


def test_write_bytes_atomic_replaces_content(tmp_path):
    loc = locate(str(tmp_path / "progress.json"), STORAGE)
    write_bytes_atomic(loc, b"x" * 10_000)
    write_bytes_atomic(loc, b"short")
    assert read_bytes(loc) == b"short"
    assert os.listdir(tmp_path) == ["progress.json"]


def test_json_roundtrip_and_missing(tmp_path):
    loc = locate(str(tmp_path / "p.json"), STORAGE)
    assert read_json(loc) is None
    assert read_bytes(loc) is None
    write_json_atomic(loc, {"b": 1, "a": [1, 2]})
    assert read_json(loc) == {"a": [1, 2], "b": 1}
    assert (tmp_path / "p.json").read_text().endswith("\n")


def test_list_files_ignores_dot_files_dirs_and_suffix(tmp_path):
    for name in ("b.parquet", "a.parquet", ".a.parquet.tmp-123", ".hidden.parquet", "x.json"):
        (tmp_path / name).write_bytes(b"1")
    (tmp_path / "sub.parquet").mkdir()
    (tmp_path / "sub.parquet" / "c.parquet").write_bytes(b"1")
    loc = locate(str(tmp_path), STORAGE)
    names = [os.path.basename(i.path) for i in list_files(loc, ".parquet")]
    assert names == ["a.parquet", "b.parquet"]
    assert [os.path.basename(i.path) for i in list_files(loc)] == [
        "a.parquet", "b.parquet", "x.json"]


def test_list_files_missing_folder_is_empty(tmp_path):
    assert list_files(locate(str(tmp_path / "nope" / "deeper"), STORAGE)) == []


# --- sources: JSONL ---------------------------------------------------------------------

def lines_of(path, **kw) -> list[tuple[int, str]]:
    """(line, text) of every readable line; lines the reader found a problem in fail."""
    got = list(iter_jsonl_lines(locate(str(path), STORAGE), **kw))
    assert [problem for _, _, problem in got] == [None] * len(got), got
    return [(n, text) for n, text, _ in got]


def test_jsonl_numbering_with_blank_lines_and_no_final_newline(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"a":1}\n\n   \n{"a":2}\n\t\n{"a":3}')
    assert lines_of(path) == [(1, '{"a":1}'), (4, '{"a":2}'), (6, '{"a":3}')]
    assert count_rows(locate(str(path), STORAGE)) == 3


def test_jsonl_final_newline_and_trailing_blanks(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"a":1}\n{"a":2}\n\n\n')
    assert lines_of(path) == [(1, '{"a":1}'), (2, '{"a":2}')]


def test_jsonl_leading_blank_lines_counted(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\n\n{"a":1}')
    assert lines_of(path) == [(3, '{"a":1}')]


def test_jsonl_empty_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"")
    assert lines_of(path) == []


def test_jsonl_line_longer_than_read_chunk(tmp_path):
    big = json.dumps({"messages": [{"role": "user", "content": "é" * READ_CHUNK_BYTES}]})
    assert len(big.encode()) > 2 * READ_CHUNK_BYTES
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"a":1}\n' + big.encode() + b'\n\n{"a":3}\n')
    got = lines_of(path)
    assert [n for n, _ in got] == [1, 2, 4]
    assert got[1][1] == big  # multi-byte chars split across chunks decode intact
    assert parse_row(got[1][1])["key"].startswith("sha256:")


def test_jsonl_lines_across_small_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "READ_CHUNK_BYTES", 3)
    path = tmp_path / "p.jsonl"
    path.write_bytes('{"x":"ü"}\n\n{"y":2}\n{"z":3}'.encode())
    assert lines_of(path) == [(1, '{"x":"ü"}'), (3, '{"y":2}'), (4, '{"z":3}')]


def test_jsonl_crlf_lines_still_parse(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"messages":[{"role":"user","content":"a"}]}\r\n\r\n'
                     b'{"messages":[{"role":"user","content":"b"}]}\r\n')
    got = lines_of(path)
    assert [n for n, _ in got] == [1, 3]
    assert all(parse_row(raw)["key"] for _, raw in got)


def test_jsonl_invalid_utf8_is_a_problem_named_with_its_byte(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"a":1}\n{"a":"\xff"}\n{"a":3}\n')
    got = list(iter_jsonl_lines(locate(str(path), STORAGE)))
    assert [(n, problem) for n, _, problem in got][::2] == [(1, None), (3, None)]
    n, text, problem = got[1]
    assert n == 2 and text == '{"a":"\\xff"}'  # shown, never silently replaced
    assert problem.startswith("not valid UTF-8: byte 0xff at byte 6 of the line")
    with pytest.raises(RowError, match="not valid UTF-8"):
        parse_row(text, problem)


def test_a_line_longer_than_the_limit_is_a_problem_and_is_never_held_whole(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"a":1}\n' + b"x" * 5000 + b'\n{"a":3}')
    got = list(iter_jsonl_lines(locate(str(path), STORAGE), max_line_bytes=1024))
    assert [(n, p is None) for n, _, p in got] == [(1, True), (2, False), (3, True)]
    _, text, problem = got[1]
    assert len(text) == 1025 and "5,000 bytes" in problem  # limit + 1 bytes kept, at most
    assert "job.max_line_bytes (1,024)" in problem


def test_a_file_without_newlines_is_read_in_one_linear_pass(tmp_path, monkeypatch):
    """Each byte is searched for a newline once: the old reader re-split everything
    read so far at every chunk (quadratic)."""
    monkeypatch.setattr(sources, "READ_CHUNK_BYTES", 1000)
    searched = []

    class CountingBytes(bytes):
        def find(self, sub, start=0, *args):
            searched.append(len(self) - start)
            return bytes.find(self, sub, start, *args)

    class File:  # what the reader opens: a random-access file (RetryingInputFile's)
        def __init__(self, path):
            self.f = open(path, "rb")

        def size(self):
            return os.fstat(self.f.fileno()).st_size

        def read_at(self, n, offset):
            self.f.seek(offset)
            return CountingBytes(self.f.read(n))

        def close(self):
            self.f.close()

    class CountingFS:
        def open_input_file(self, path):
            return File(path)

    path = tmp_path / "p.jsonl"
    path.write_bytes(b"y" * 200_000)
    loc = sources.Location(CountingFS(), str(path), str(path))
    (got,) = iter_jsonl_lines(loc, max_line_bytes=1 << 20)
    assert got[0] == 1 and got[2] is None and len(got[1]) == 200_000
    assert sum(searched) == 200_000  # every byte searched once


def test_blocks_respect_limit_and_block_size(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(f'{{"i":{i}}}\n\n' for i in range(10)))
    loc = locate(str(path), STORAGE)
    blocks = list(_blocks(loc, 2, limit=7, block_rows=3))
    assert [b.num_rows for b in blocks] == [3, 3, 1]
    table = pa.concat_tables(blocks)
    assert table.column("line").to_pylist() == [1, 3, 5, 7, 9, 11, 13]
    # ordinal: file index 2 in job.input, then the line: sorts rows in input order
    assert table.column("ordinal").to_pylist() == [(2 << 40) | n for n in
                                                   [1, 3, 5, 7, 9, 11, 13]]
    assert sources.place_of_ordinal(["a", "b", "c"], (2 << 40) | 13) == "c:13"
    assert set(table.column("source").to_pylist()) == {str(path)}
    assert table.schema == sources.RAW_SCHEMA


# --- sources: Parquet -------------------------------------------------------------------

def test_parquet_rows_numbered_as_json(tmp_path):
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"}]}
            for i in range(5)]
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
    loc = locate(str(path), STORAGE)
    got = list(iter_parquet_rows(loc))
    assert [n for n, _, _ in got] == [1, 2, 3, 4, 5]
    assert [json.loads(raw) for _, raw, _ in got] == rows
    assert list(iter_rows(loc)) == got  # dispatch by suffix
    assert count_rows(loc) == 5
    assert [parse_row(raw)["key"] for _, raw, _ in got] == [f"r{i}" for i in range(5)]


def test_parquet_batches_beyond_one_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "PARQUET_BATCH_ROWS", 4)
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"i": list(range(10))}), path)
    got = list(iter_parquet_rows(locate(str(path), STORAGE)))
    assert [n for n, _, _ in got] == list(range(1, 11))
    assert [json.loads(raw)["i"] for _, raw, _ in got] == list(range(10))


def test_parquet_non_json_types_become_strings(tmp_path):
    import datetime as dt
    path = tmp_path / "p.parquet"
    when = dt.datetime(2025, 1, 2, 3, 4, 5)
    pq.write_table(pa.table({"t": [when]}), path)
    (_, raw, _), = iter_parquet_rows(locate(str(path), STORAGE))
    assert json.loads(raw) == {"t": str(when)}


def test_parquet_mixed_tool_rows_validate(tmp_path):
    # In Parquet, messages are a list<struct>: the struct has the union of the fields of
    # all messages, so a plain user message reads back with "tool_calls": None as soon
    # as any row in the file holds a tool call. Both rows are valid prompts.
    rows = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "w", "arguments": "{}"}}]},
            {"role": "tool", "content": "sunny"}]},
    ]
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    raws = [raw for _, raw, _ in iter_parquet_rows(locate(str(path), STORAGE))]
    assert json.loads(raws[0])["messages"][0]["tool_calls"] is None
    for raw in raws:
        parse_row(raw)  # must not raise RowError
