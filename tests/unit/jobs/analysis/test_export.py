"""jobs.analysis.export on synthetic runs written as real part files: token-exact records, the
latest version per key, each filter counted, shards and their manifest, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.analysis import export as ex
from jobs.io.storage import write_json_atomic
from tests.support.run_rows import make_row, write_rows


def read_jsonl(folder: Path) -> list[dict]:
    manifest = json.loads((folder / ex.MANIFEST).read_text())
    return [json.loads(line) for f in manifest["files"]
            for line in (folder / f["name"]).read_text().splitlines()]


def versioned_run(store) -> dict[str, dict]:
    """Keys k000..k029; every 3rd continued (v1, stop); returns each key's latest row."""
    rows, latest = [], {}
    for i in range(30):
        v0 = make_row(f"k{i:03d}", prompt_token_ids=[100 + i, 7], output_token_ids=[i, 1, 2],
                      finish_reason="length" if i % 3 == 0 else "stop")
        rows.append(v0)
        latest[v0["key"]] = v0
        if i % 3 == 0:
            v1 = make_row(f"k{i:03d}", 1, prompt_token_ids=[100 + i, 7],
                          output_token_ids=[i, 1, 2, 3, 4, 5], finish_reason="stop")
            rows.append(v1)
            latest[v1["key"]] = v1
    write_rows(store, "data", rows, per_file=7)
    return latest


def test_pretokenized_records_are_the_latest_versions_ids_exactly(store, tmp_path):
    latest = versioned_run(store)
    manifest = ex.export(store, str(tmp_path / "out"), "pretokenized")
    records = read_jsonl(tmp_path / "out")
    assert sorted(r["id"] for r in records) == sorted(latest)   # all 30 end in stop
    for r in records:
        row = latest[r["id"]]
        assert r["input_ids"] == row["prompt_token_ids"] + row["output_token_ids"]
        assert r["loss_mask"] == [0] * 2 + [1] * len(row["output_token_ids"])
        assert set(r) == {"id", "input_ids", "loss_mask"}
    assert manifest["rows"] == 30 and manifest["keys"] == 30
    assert manifest["data_rows"] == 40 and manifest["older_versions_skipped"] == 10
    assert manifest["dropped"] == {"integrity": 0, "finish_reason": 0}


def test_records_follow_the_trainers_documented_pretokenized_contract(store, tmp_path):
    """The contract both loaders check, from their sources (speculators 0.9.0
    speculators/data_generation/preprocessing.py `_passthrough_pretokenized`: rows with
    input_ids and loss_mask pass through, lengths must match; SpecForge 0.2.0
    specforge/data/prompt_builder.py `prepare_prompt_tasks`: a JSONL file whose first
    record has both keys is pre-tokenized, a record needs >= 1 supervised token)."""
    versioned_run(store)
    ex.export(store, str(tmp_path / "out"), "pretokenized")
    records = read_jsonl(tmp_path / "out")
    assert {"input_ids", "loss_mask"} <= set(records[0])
    for r in records:
        assert len(r["input_ids"]) == len(r["loss_mask"])
        assert set(r["loss_mask"]) == {0, 1} and sum(r["loss_mask"]) >= 1
        assert all(isinstance(t, int) for t in r["input_ids"])


def test_truncated_rows_only_on_request_and_with_no_invented_end_token(store, tmp_path):
    write_rows(store, "data", [make_row("cut", output_token_ids=[9, 9, 8],
                                        finish_reason="length", finished_thinking=False),
                               make_row("done")])
    default = ex.export(store, str(tmp_path / "a"), "pretokenized")
    assert default["dropped"] == {"integrity": 0, "finish_reason": 1} and default["rows"] == 1
    kept = ex.export(store, str(tmp_path / "b"), "pretokenized", ex.Filters(include_truncated=True))
    cut = next(r for r in read_jsonl(tmp_path / "b") if r["id"] == "cut")
    assert kept["rows"] == 2 and cut["input_ids"] == [1, 2, 3, 9, 9, 8]


def test_each_filter_drops_and_counts_its_rows(store, tmp_path):
    write_rows(store, "data", [
        make_row("ok", category="coding"),
        make_row("aborted", finish_reason="abort"),
        make_row("cut", finish_reason="length"),
        make_row("unfinished", finished_thinking=False, answer=""),
        make_row("loop", repetition_ratio=0.9),
        make_row("long", output_token_ids=list(range(20))),
        make_row("chatty", category="chat"),
    ])
    filters = ex.Filters(include_truncated=True, require_finished_thinking=True,
                         max_repetition_ratio=0.5, max_length=10, categories=("coding",))
    manifest = ex.export(store, str(tmp_path / "out"), "conversations", filters)
    assert [r["id"] for r in read_jsonl(tmp_path / "out")] == ["ok"]
    # "cut" is kept by finish_reason (--include-truncated) and dropped by category.
    assert manifest["dropped"] == {"integrity": 0, "finish_reason": 1, "finished_thinking": 1,
                                   "repetition_ratio": 1, "max_length": 1, "category": 2}


def test_flagged_rows_are_left_out_and_counted_unless_kept(store, tmp_path):
    write_rows(store, "data", [
        make_row("ok"),
        make_row("empty", answer="", integrity_flags=["empty_answer"]),
        make_row("loop", integrity_flags=["token_run", "missing_think_end"]),
        # Written before raygen recorded flags (null): checked at export on what it holds.
        make_row("old-broken", finished_thinking=False, answer="", integrity_flags=None),
        make_row("old-sound", integrity_flags=None),
    ])
    manifest = ex.export(store, str(tmp_path / "out"), "messages")
    assert sorted(r["id"] for r in read_jsonl(tmp_path / "out")) == ["ok", "old-sound"]
    assert manifest["dropped"]["integrity"] == 3
    assert manifest["integrity_flags"] == {"empty_answer": 1, "missing_think_end": 2,
                                           "token_run": 1}
    kept = ex.export(store, str(tmp_path / "all"), "messages", ex.Filters(keep_flagged=True))
    assert kept["rows"] == 5 and "integrity" not in kept["dropped"]
    assert kept["integrity_flags"] == manifest["integrity_flags"]  # counted either way


def test_chat_records_carry_prompt_turns_then_answer_without_think_tags(store, tmp_path):
    prompt = [{"role": "user", "content": "Weather?"},
              {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type":
               "function", "function": {"name": "wx", "arguments": "{\"city\": \"Oslo\"}"}}]},
              {"role": "tool", "content": "rain"}]
    tools = json.dumps([{"type": "function", "function": {"name": "wx"}}])
    write_rows(store, "data", [make_row("t", messages=json.dumps(prompt), tools=tools,
                                        reasoning="<think>\nIt rains.", answer="Take one.</think>")])
    for fmt in ("conversations", "messages"):
        ex.export(store, str(tmp_path / fmt), fmt)
        [record] = read_jsonl(tmp_path / fmt)
        assert record == {"id": "t", "tools": tools, fmt: prompt + [
            {"role": "assistant", "content": "Take one.", "reasoning_content": "It rains."}]}


def test_shards_are_cut_and_a_rerun_leaves_no_stale_shard(store, tmp_path):
    versioned_run(store)
    out = tmp_path / "out"
    first = ex.export(store, str(out), "pretokenized", rows_per_file=7)
    assert [f["rows"] for f in first["files"]] == [7, 7, 7, 7, 2]
    (out / "README.txt").write_text("mine")
    second = ex.export(store, str(out), "pretokenized", rows_per_file=100)
    assert sorted(p.name for p in out.iterdir()) == ["README.txt", "export.manifest",
                                                     "part-00000.jsonl"]
    assert second["files"][0]["rows"] == 30 and len(read_jsonl(out)) == 30


@pytest.mark.parametrize("fmt", ex.FORMATS)
def test_parquet_shards_share_one_schema_per_format(store, tmp_path, fmt):
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    with_call = json.dumps([{"role": "user", "content": "q"},
                            {"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "content": "r"}])
    write_rows(store, "data", [make_row("a"), make_row("b", messages=with_call)])
    manifest = ex.export(store, str(tmp_path / "out"), fmt, file_type="parquet", rows_per_file=1)
    tables = [pq.read_table(tmp_path / "out" / f["name"]) for f in manifest["files"]]
    assert [t.schema for t in tables] == [ex.PARQUET_SCHEMAS[fmt]] * 2
    if fmt != "pretokenized":
        turn = tables[1].column(fmt).to_pylist()[0][1]
        assert turn["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'


def test_export_into_the_runs_own_folders_is_refused(store):
    versioned_run(store)
    for inside in (store.uri, f"{store.uri}/data", f"{store.uri}/final/x"):
        with pytest.raises(ex.ExportError, match="the run's own"):
            ex.export(store, inside, "pretokenized")


def test_a_running_run_is_refused_unless_forced(store, tmp_path):
    versioned_run(store)
    write_json_atomic(store.loc("progress.json"), {"status": "running"})
    with pytest.raises(ex.ExportError, match="still running"):
        ex.export(store, str(tmp_path / "out"), "pretokenized")
    assert ex.export(store, str(tmp_path / "out"), "pretokenized", force=True)["rows"] == 30


def test_an_empty_run_has_nothing_to_export(store, tmp_path):
    write_json_atomic(store.loc("progress.json"), {"status": "succeeded"})
    with pytest.raises(ex.ExportError, match="no rows in data/"):
        ex.export(store, str(tmp_path / "out"), "messages")


@pytest.mark.parametrize("extra, message", [
    (["--max-repetition-ratio", "2"], "--max-repetition-ratio must be within 0..1"),
    (["--max-length", "0"], "--max-length must be >= 1"),
    (["--rows-per-file", "0"], "--rows-per-file must be >= 1"),
    (["--out", "ftp://host/x"], "unsupported URI scheme"),
])
def test_cli_errors_are_one_line(store, tmp_path, capsys, extra, message):
    versioned_run(store)
    argv = [store.uri, "--format", "messages", "--out", str(tmp_path / "out")] + extra
    with pytest.raises(SystemExit) as info:
        ex.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 1 and message in err and err.count("\n") == 1


def test_cli_prints_the_summary(store, tmp_path, capsys):
    versioned_run(store)
    assert ex.main([store.uri, "--format", "pretokenized", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "exported 30 rows (pretokenized, jsonl)" in out
    assert "10 older versions skipped" in out and "dropped:  none" in out


@pytest.mark.parametrize("file_type", ex.FILE_TYPES)
def test_shards_load_with_hf_datasets_when_only_a_later_shard_has_tools(store, tmp_path,
                                                                        file_type):
    import datasets
    tools = json.dumps([{"type": "function", "function": {"name": "wx"}}])
    write_rows(store, "data", [make_row(k) for k in "abc"] + [make_row("d", tools=tools)],
               per_file=1)
    manifest = ex.export(store, str(tmp_path / "out"), "messages", file_type=file_type,
                         rows_per_file=1)
    files = [str(tmp_path / "out" / f["name"]) for f in manifest["files"]]
    first = (pq.read_table(files[0]).to_pylist()[0] if file_type == "parquet"
             else json.loads(Path(files[0]).read_text()))
    assert json.loads(first["tools"] or "[]") == [], "the first shard must have no tools"
    ds = datasets.load_dataset("json" if file_type == "jsonl" else "parquet", data_files=files,
                               split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 4
    # The folder as a whole, as trainers point at it: the manifest is not read as data.
    folder = datasets.load_dataset(str(tmp_path / "out"), split="train",
                                   cache_dir=str(tmp_path / "hf"))
    assert sorted(folder["id"]) == ["a", "b", "c", "d"]
    assert {r["id"]: json.loads(r["tools"]) for r in ds}["d"] == json.loads(tools)


def test_fast_pretokenized_lines_equal_json_of_the_record(store):
    rows = [make_row("k\u00e9\"q", prompt_token_ids=[1, 2], output_token_ids=[3]),
            make_row("empty-output", prompt_token_ids=[5], output_token_ids=[]),
            make_row("big", prompt_token_ids=[151644, 0], output_token_ids=[2**31 - 1, 7])]
    write_rows(store, "data", rows)
    table = store.read_kind("data")
    lines = list(ex.pretokenized_lines(table))
    assert lines == [(json.dumps(ex.pretokenized_record(r), ensure_ascii=False) + "\n").encode()
                     for r in table.to_pylist()]


def test_a_mix_exports_by_setting_and_thinking_off_rows_as_answers(store, tmp_path):
    """--setting keeps a sampling mix's chosen settings (counted as dropped by "setting"),
    --extra-columns setting names each record's; a thinking-off row (reasoning empty, its
    empty think block in the prompt) is a plain answer turn and its pretokenized mask
    covers its output only."""
    write_rows(store, "data", [
        make_row("t1", setting="think"), make_row("t2", setting="think"),
        make_row("d1", setting="direct", reasoning="", answer="Just this.",
                 sampling='{"thinking": false}', reasoning_tokens=0,
                 prompt_token_ids=[1, 2, 3, 4], output_token_ids=[5, 6])])
    manifest = ex.export(store, str(tmp_path / "direct"), "messages",
                         ex.Filters(settings=("direct",)), extras=("setting",))
    [record] = read_jsonl(tmp_path / "direct")
    assert record["setting"] == "direct" and record["messages"][-1] == {
        "role": "assistant", "content": "Just this.", "reasoning_content": ""}
    assert manifest["dropped"]["setting"] == 2
    assert manifest["filters"]["settings"] == ["direct"]
    ex.export(store, str(tmp_path / "ids"), "pretokenized", ex.Filters(settings=("direct",)))
    [ids] = read_jsonl(tmp_path / "ids")
    assert ids["input_ids"] == [1, 2, 3, 4, 5, 6] and ids["loss_mask"] == [0] * 4 + [1] * 2
    every = ex.export(store, str(tmp_path / "all"), "messages", extras=("setting",))
    assert every["rows"] == 3 and "settings" not in every["filters"]  # unset: not recorded
    assert sorted(r["setting"] for r in read_jsonl(tmp_path / "all")) == [
        "direct", "think", "think"]


def test_filters_record_settings_only_when_set_so_older_journals_compare_equal():
    """An incremental export's journal written before --setting holds filters without
    the key: the same options today must compare equal (export_journal.check_options)."""
    before = {"include_truncated": False, "require_finished_thinking": False,
              "max_repetition_ratio": None, "max_length": None, "categories": [],
              "keep_flagged": False}
    assert ex.Filters().as_json() == before
    assert ex.Filters.of_json(before) == ex.Filters()
    chosen = ex.Filters(settings=("direct",))
    assert chosen.as_json()["settings"] == ["direct"]
    assert ex.Filters.of_json(chosen.as_json()) == chosen
