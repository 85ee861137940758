"""`raygen export --incremental` on synthetic runs written as real part files: each call
exports only what is new, later versions supersede earlier records by the journal's
rule, filters and flags as in a full export, the lock, a damaged journal or part."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobs.analysis import export as ex
from jobs.analysis import export_journal as ej
from jobs.analysis import incremental_export as ie
from jobs.config import StorageConfig
from jobs.io.storage import AlreadyExists, create_exclusive, locate, write_json_atomic
from tests.support.run_rows import make_row, write_rows

INCLUDE = ex.Filters(include_truncated=True)


def live_records(folder: Path) -> dict[str, dict]:
    """The trainer's reading, as docs/export.md states the rule: every batch's shards, minus
    the records a later batch's `supersedes` lists. Fails on a key seen twice."""
    batches = [json.loads(p.read_text()) for p in sorted(folder.glob("batch-*.manifest"))]
    skip = {(int(b), k) for m in batches for b, keys in m["supersedes"].items() for k in keys}
    live: dict[str, dict] = {}
    for m in batches:
        for f in m["files"]:
            for line in (folder / f["name"]).read_text().splitlines():
                record = json.loads(line)
                if (m["batch"], record["id"]) not in skip:
                    assert record["id"] not in live, f"{record['id']} twice"
                    live[record["id"]] = record
    return live


def full_export(store, tmp_path, filters=INCLUDE) -> dict[str, dict]:
    out = tmp_path / "full"
    ex.export(store, str(out), "pretokenized", filters, force=True)
    return {r["id"]: r for f in sorted(out.glob("part-*.jsonl"))
            for r in map(json.loads, f.read_text().splitlines())}


def rows(n: int, version: int = 0, start: int = 0, **over) -> list[dict]:
    return [make_row(f"k{i:03d}", version, output_token_ids=[i, version, 9], **over)
            for i in range(start, start + n)]


def test_each_call_exports_what_is_new_and_continued_rows_supersede(store, tmp_path):
    out = tmp_path / "inc"
    write_rows(store, "data", rows(6, finish_reason="length") + rows(6, start=6), per_file=4)
    write_json_atomic(store.loc("progress.json"), {"status": "running"})  # not refused
    first = ie.export_incremental(store, str(out), "pretokenized", INCLUDE, rows_per_file=5)
    assert (first["batch"], first["rows"], len(first["files"])) == (0, 12, 3)
    assert first["supersedes"] == {} and first["live_keys"] == 12
    assert ie.export_incremental(store, str(out), "pretokenized", INCLUDE) is None
    assert len(list(out.glob("batch-*.manifest"))) == 1  # nothing new: nothing written
    # three truncated rows continued (v1), two new keys
    write_rows(store, "data", rows(3, version=1) + rows(2, start=12), per_file=4)
    second = ie.export_incremental(store, str(out), "pretokenized", INCLUDE)
    assert (second["batch"], second["rows"], second["keys_looked_at"]) == (1, 5, 5)
    assert second["supersedes"] == {"0": ["k000", "k001", "k002"]}
    assert second["live_keys"] == 14 and second["watermark"]["data_rows"] == 17
    live = live_records(out)
    assert live == full_export(store, tmp_path)  # each key once, at its latest version
    assert live["k001"]["input_ids"][-3:] == [1, 1, 9]


def test_a_newer_row_a_filter_drops_withdraws_the_earlier_record(store, tmp_path):
    out = tmp_path / "inc"
    write_rows(store, "data", rows(4), per_file=4)
    ie.export_incremental(store, str(out), "pretokenized")
    # k000 re-generated as v1 with a broken output: flagged, dropped by default
    write_rows(store, "data", [make_row("k000", 1, integrity_flags=["empty_answer"]),
                               make_row("k009", finish_reason="length")])
    batch = ie.export_incremental(store, str(out), "pretokenized")
    assert batch["rows"] == 0 and batch["supersedes"] == {"0": ["k000"]}
    assert batch["dropped"] == {"integrity": 1, "finish_reason": 1}
    assert batch["integrity_flags"] == {"empty_answer": 1} and batch["live_keys"] == 3
    assert set(live_records(out)) == {"k001", "k002", "k003"}
    assert set(full_export(store, tmp_path, ex.Filters())) == {"k001", "k002", "k003"}
    # the dropped rows were looked at: not read again until they change
    assert ie.export_incremental(store, str(out), "pretokenized") is None


def test_a_later_call_keeps_the_first_calls_options(store, tmp_path):
    out = str(tmp_path / "inc")
    write_rows(store, "data", rows(3))
    ie.export_incremental(store, out, "pretokenized")
    write_rows(store, "data", rows(1, start=3))
    with pytest.raises(ej.JournalError, match=r"started with filters = .*include_truncated"):
        ie.export_incremental(store, out, "pretokenized", INCLUDE)
    with pytest.raises(ej.JournalError, match="started with format = \"pretokenized\""):
        ie.export_incremental(store, out, "messages")
    assert ie.export_incremental(store, out, "pretokenized")["rows"] == 1


def test_full_and_incremental_exports_never_share_a_folder(store, tmp_path):
    write_rows(store, "data", rows(3))
    ie.export_incremental(store, str(tmp_path / "inc"), "pretokenized")
    with pytest.raises(ex.ExportError, match="holds an incremental export"):
        ex.export(store, str(tmp_path / "inc"), "pretokenized")
    ex.export(store, str(tmp_path / "full"), "pretokenized")  # a format-1 manifest
    with pytest.raises(ex.ExportError, match="holds a full export"):
        ie.export_incremental(store, str(tmp_path / "full"), "pretokenized")


def test_parquet_batches_carry_extra_columns(store, tmp_path):
    import pyarrow.parquet as pq
    out = tmp_path / "inc"
    write_rows(store, "data", rows(2, accept_length=2.5))
    ie.export_incremental(store, str(out), "messages", file_type="parquet",
                          extras=("accept_length",))
    [shard] = out.glob("part-b00000-*.parquet")
    table = pq.read_table(shard)
    assert table.column_names == ["id", "messages", "tools", "accept_length"]
    assert table["accept_length"].to_pylist() == [2.5, 2.5]


# --- the journal's damage and the lock ------------------------------------------------

def two_batches(store, tmp_path) -> Path:
    out = tmp_path / "inc"
    write_rows(store, "data", rows(3))
    ie.export_incremental(store, str(out), "pretokenized")
    write_rows(store, "data", rows(2, start=3))
    ie.export_incremental(store, str(out), "pretokenized")
    write_rows(store, "data", rows(1, start=5))
    return out


def _manifest(out: Path, n: int) -> dict:
    return json.loads((out / ej.batch_name(n)).read_text())


@pytest.mark.parametrize("damage, message", [
    (lambda out: (out / "batch-00000.manifest").unlink(), "batch-00000.manifest is missing"),
    (lambda out: (out / "batch-00001.manifest").write_text("{\"batch\": 1"),
     "batch-00001.manifest is not a batch manifest"),
    (lambda out: (out / _manifest(out, 0)["keys_file"]["name"]).unlink(),
     r"\(the keys of batch 0\) is missing"),
    (lambda out: (out / _manifest(out, 1)["keys_file"]["name"]).write_bytes(b"x"),
     "is not the sha256 its manifest recorded"),
    (lambda out: (out / _manifest(out, 1)["files"][0]["name"]).unlink(),
     "shard part-b00001-.* of batch 1 is missing"),
    (lambda out: (out / _manifest(out, 0)["files"][0]["name"]).write_text("{}\n"),
     "of batch 0 is 3 bytes, recorded"),
    (lambda out: (out / "batch-00001.manifest").write_text(json.dumps(
        {**_manifest(out, 1), "journal_format": 9})), "has journal_format 9"),
])
def test_a_damaged_journal_is_an_error_naming_the_file(store, tmp_path, damage, message):
    out = two_batches(store, tmp_path)
    damage(out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ej.JournalError, match=message):
        ie.export_incremental(store, str(out), "pretokenized")
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written or removed


def test_a_damaged_journal_is_one_cli_line(store, tmp_path, capsys):
    out = two_batches(store, tmp_path)
    (out / "batch-00000.manifest").unlink()
    with pytest.raises(SystemExit) as info:
        ex.main([store.uri, "--format", "pretokenized", "--out", str(out), "--incremental"])
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1 and "export to a new --out" in err


def test_files_of_a_call_that_died_before_its_commit_are_removed(store, tmp_path):
    out = two_batches(store, tmp_path)
    dead = ["part-b00002-deadbeef-00000.jsonl", "batch-00002-deadbeef.keys"]
    for name in dead:
        (out / name).write_text("half\n")
    batch = ie.export_incremental(store, str(out), "pretokenized")
    assert batch["batch"] == 2 and not any((out / name).exists() for name in dead)
    assert len(live_records(out)) == 6


def test_a_digest_change_is_refused(store, tmp_path):
    out = two_batches(store, tmp_path)
    m = _manifest(out, 1)
    (out / "batch-00001.manifest").write_text(json.dumps({**m, "digest_probes": ["12345"]}))
    with pytest.raises(ej.JournalError, match="key digests changed"):
        ie.export_incremental(store, str(out), "pretokenized")


def test_a_damaged_part_commits_nothing_and_the_next_call_goes_on(store, tmp_path):
    out = tmp_path / "inc"
    write_rows(store, "data", rows(3))
    ie.export_incremental(store, str(out), "pretokenized")
    before = set(store.part_paths("data"))
    write_rows(store, "data", rows(4, start=3), per_file=2)
    path = Path(sorted(set(store.part_paths("data")) - before)[0])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the sidecar's sha256 tells
    path.write_bytes(bytes(data))
    with pytest.raises(ex.ExportError, match="found damaged and moved to quarantine"):
        ie.export_incremental(store, str(out), "pretokenized")
    assert sorted(p.name.split("-")[1] for p in out.glob("part-*")) == ["b00000"]
    batch = ie.export_incremental(store, str(out), "pretokenized")
    assert batch["batch"] == 1 and batch["rows"] == 2  # the sound part's rows


def test_a_held_lock_refuses_a_second_export_and_a_stale_one_is_taken_over(store, tmp_path):
    write_rows(store, "data", rows(3))
    out = str(tmp_path / "inc")
    loc = locate(out, StorageConfig())
    holder = ej.ExportLock(loc, StorageConfig())
    holder.acquire()
    with pytest.raises(ej.JournalError, match=r"another incremental export to .* is running: "
                                              r"export-\d+ on .* lock renewed \d+ s ago"):
        ie.export_incremental(store, out, "pretokenized")
    assert not list(Path(out).glob("batch-*"))
    # its call died: unrenewed past LOCK_STALE_S on the store's clock, it is taken over
    old = os.stat(loc.join(ej.LOCK).path).st_mtime - ej.LOCK_STALE_S - 5
    os.utime(loc.join(ej.LOCK).path, (old, old))
    assert ie.export_incremental(store, out, "pretokenized")["rows"] == 3
    assert not Path(loc.join(ej.LOCK).path).exists()  # released
    with pytest.raises(ej.JournalError, match="was taken over while this export ran"):
        holder.renew(force=True)  # the dead call, had it woken up, stops


def test_a_lost_commit_removes_the_calls_files(tmp_path):
    out = locate(str(tmp_path / "inc"), StorageConfig())
    os.makedirs(out.path)
    (tmp_path / "inc" / "batch-00000.manifest").write_text("{}")  # another call's
    (tmp_path / "inc" / "part-b00000-abc-00000.jsonl").write_text("mine\n")
    with pytest.raises(ej.JournalError, match="committed batch 0 of .* first"):
        ej.commit(out, StorageConfig(), {"batch": 0}, ["part-b00000-abc-00000.jsonl"])
    assert sorted(p.name for p in (tmp_path / "inc").iterdir()) == ["batch-00000.manifest"]
    assert (tmp_path / "inc" / "batch-00000.manifest").read_text() == "{}"


def test_create_exclusive_writes_once_and_leaves_no_temp_file(tmp_path):
    loc = locate(str(tmp_path / "x.manifest"), StorageConfig())
    create_exclusive(loc, b"one", StorageConfig())
    with pytest.raises(AlreadyExists):
        create_exclusive(loc, b"two", StorageConfig())
    assert [p.name for p in tmp_path.iterdir()] == ["x.manifest"]
    assert (tmp_path / "x.manifest").read_bytes() == b"one"


def test_cli_exports_a_batch_then_says_nothing_is_new(store, tmp_path, capsys):
    write_rows(store, "data", rows(3))
    argv = [store.uri, "--format", "pretokenized", "--out", str(tmp_path / "o"), "--incremental"]
    assert ex.main(argv) == 0 and ex.main(argv) == 0
    out = capsys.readouterr().out
    assert "exported batch 0: 3 rows (pretokenized, jsonl)" in out
    assert "live:       3 keys across batches 0..0" in out
    assert "nothing new to export" in out
