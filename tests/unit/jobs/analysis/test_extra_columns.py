"""`export --extra-columns accept_length,category`: the row's values in every record of
every format and file type, one Parquet schema, null where the run has none."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from jobs.analysis import export as ex
from jobs.analysis import extra_columns
from tests.support.run_rows import make_row, write_rows

ROWS = [make_row("fast", category="chat", spec_verify_ct=250, accept_length=4.0),
        make_row("hard", category="coding", spec_verify_ct=625, accept_length=1.6),
        make_row("nospec", category="math")]   # no speculative decoding: accept_length null
EXPECTED = {"fast": (4.0, "chat"), "hard": (1.6, "coding"), "nospec": (None, "math")}


def records(folder, manifest, file_type) -> list[dict]:
    if file_type == "parquet":
        return [r for f in manifest["files"] for r in pq.read_table(folder / f["name"]).to_pylist()]
    return [json.loads(line) for f in manifest["files"]
            for line in (folder / f["name"]).read_text().splitlines()]


@pytest.mark.parametrize("file_type", ex.FILE_TYPES)
@pytest.mark.parametrize("fmt", ex.FORMATS)
def test_every_format_carries_the_rows_accept_length_and_category(store, tmp_path, fmt,
                                                                  file_type):
    write_rows(store, "data", ROWS, per_file=2)
    out = tmp_path / "out"
    plain = ex.export(store, str(tmp_path / "plain"), fmt, file_type=file_type, rows_per_file=2)
    manifest = ex.export(store, str(out), fmt, file_type=file_type, rows_per_file=2,
                         extras=("accept_length", "category"))
    assert manifest["extra_columns"] == ["accept_length", "category"]
    got = records(out, manifest, file_type)
    base = {r["id"]: r for r in records(tmp_path / "plain", plain, file_type)}
    assert sorted(r["id"] for r in got) == sorted(EXPECTED)
    for r in got:
        assert (r["accept_length"], r["category"]) == EXPECTED[r["id"]]
        # the format's own record is unchanged, the extra keys come after it
        assert {k: v for k, v in r.items() if k not in ("accept_length", "category")} == base[r["id"]]
        assert list(r)[-2:] == ["accept_length", "category"]
    if file_type == "parquet":
        schemas = [pq.read_table(out / f["name"]).schema for f in manifest["files"]]
        assert schemas == [extra_columns.schema(
            ex.PARQUET_SCHEMAS[fmt], ("accept_length", "category"))] * 2


def test_the_order_given_is_the_order_written_and_category_alone_works(store, tmp_path):
    write_rows(store, "data", ROWS)
    for extras in (("category",), ("category", "accept_length")):
        manifest = ex.export(store, str(tmp_path / "o"), "pretokenized", extras=extras)
        line = (tmp_path / "o" / manifest["files"][0]["name"]).read_text().splitlines()[0]
        assert list(json.loads(line))[3:] == list(extras)


def test_fast_pretokenized_lines_equal_json_of_the_record_with_extras(store):
    rows = [make_row("k\u00e9\"q", category="caf\u00e9 \"x\"", accept_length=2.25,
                     spec_verify_ct=4),
            make_row("none", output_token_ids=[], accept_length=None)]
    write_rows(store, "data", rows)
    table = store.read_kind("data")
    extras = ("accept_length", "category")
    lines = list(extra_columns.lines(ex.pretokenized_lines(table), table, extras))
    assert lines == [(json.dumps(extra_columns.record(ex.pretokenized_record(r), r, extras),
                                 ensure_ascii=False) + "\n").encode() for r in table.to_pylist()]


def test_low_acceptance_rows_can_be_selected_and_weighted_with_datasets(store, tmp_path):
    import datasets
    write_rows(store, "data", ROWS[:2] + [make_row(f"r{i}", accept_length=1.0 + i / 4,
                                                       spec_verify_ct=100) for i in range(8)])
    manifest = ex.export(store, str(tmp_path / "out"), "messages", file_type="parquet",
                         rows_per_file=3, extras=("accept_length",))
    files = [str(tmp_path / "out" / f["name"]) for f in manifest["files"]]
    ds = datasets.load_dataset("parquet", data_files=files, split="train",
                               cache_dir=str(tmp_path / "hf"))
    hard = ds.filter(lambda r: r["accept_length"] < 1.75)
    assert sorted(hard["id"]) == ["hard", "r0", "r1", "r2"]


@pytest.mark.parametrize("value, message", [
    ("accept_length,latency", "unknown column(s) latency; one or more of accept_length, category"),
    ("category,category", "names a column twice"),
    (",", "unknown column(s) (none given)"),
])
def test_bad_extra_columns_are_one_line_naming_the_flag(store, tmp_path, capsys, value, message):
    write_rows(store, "data", ROWS)
    with pytest.raises(SystemExit) as info:
        ex.main([store.uri, "--format", "messages", "--out", str(tmp_path / "o"),
                 "--extra-columns", value])
    err = capsys.readouterr().err
    assert info.value.code == 1 and "--extra-columns" in err and message in err
    assert err.count("\n") == 1


def test_the_cli_flag_reaches_the_records(store, tmp_path):
    write_rows(store, "data", ROWS)
    assert ex.main([store.uri, "--format", "conversations", "--out", str(tmp_path / "o"),
                    "--extra-columns", "accept_length, category"]) == 0
    manifest = json.loads((tmp_path / "o" / ex.MANIFEST).read_text())
    got = {r["id"]: (r["accept_length"], r["category"])
           for r in records(tmp_path / "o", manifest, "jsonl")}
    assert got == EXPECTED and manifest["extra_columns"] == ["accept_length", "category"]


LOGPROBS = ("output_logprobs", "output_top_logprob_ids", "output_top_logprobs")


@pytest.mark.parametrize("file_type", ex.FILE_TYPES)
def test_logprobs_are_carried_when_asked_one_per_output_token(store, tmp_path, file_type):
    """job.logprobs' columns (float32: values a float32 holds exactly, as SGLang's are);
    a run without them exports nulls."""
    write_rows(store, "data", [
        make_row("on", output_token_ids=[4, 5], output_logprobs=[-0.5, -1.25],
                 output_top_logprob_ids=[[4, 9], [7, 5]],
                 output_top_logprobs=[[-0.5, -2.0], [-0.75, -1.25]]),
        make_row("off")])
    manifest = ex.export(store, str(tmp_path / "o"), "pretokenized", file_type=file_type,
                         extras=LOGPROBS)
    got = {r["id"]: r for r in records(tmp_path / "o", manifest, file_type)}
    assert [got["on"][c] for c in LOGPROBS] == [
        [-0.5, -1.25], [[4, 9], [7, 5]], [[-0.5, -2.0], [-0.75, -1.25]]]
    assert [got["off"][c] for c in LOGPROBS] == [None] * 3
    assert list(got["on"])[-3:] == list(LOGPROBS)
    plain = ex.export(store, str(tmp_path / "p"), "pretokenized", file_type=file_type)
    assert not set(LOGPROBS) & set(records(tmp_path / "p", plain, file_type)[0])  # off by default
