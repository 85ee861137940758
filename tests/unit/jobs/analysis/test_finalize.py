"""jobs.analysis.finalize: one row per key (its latest version), checksummed manifest, idempotent."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.analysis import finalize
from jobs.io.schema import DATA
from jobs.io.storage import write_json_atomic
from tests.support.run_rows import failure_row, make_row, write_rows


def build_run(store) -> list[dict]:
    rows = [make_row(f"k{i:03d}", completion_tokens=100 + i,
                     finish_reason="length" if i % 5 == 0 else "stop") for i in range(120)]
    # Continue every 5th key, twice for some: the latest version must win.
    for i in range(0, 120, 5):
        rows.append(make_row(f"k{i:03d}", 1, completion_tokens=5000 + i, max_new_tokens=8192,
                             finish_reason="length" if i % 10 == 0 else "stop",
                             budget_history=[4096, 8192]))
    for i in range(0, 120, 10):
        rows.append(make_row(f"k{i:03d}", 2, completion_tokens=9000 + i,
                             max_new_tokens=16384, budget_history=[4096, 8192, 16384]))
    write_rows(store, "data", rows, per_file=37)
    write_rows(store, "failures", [failure_row("gone", "EngineError"),
                                   failure_row("k001", "Timeout")])
    return rows


def read_final(root: Path, manifest: dict):
    tables = [pq.read_table(root / "final" / f["name"]) for f in manifest["files"]]
    return [r for t in tables for r in t.to_pylist()]


def test_one_row_per_key_with_latest_version(store):
    build_run(store)
    manifest = finalize.finalize(store, rows_per_file=50, allow_partial=True)
    root = Path(store.root.path)
    rows = read_final(root, manifest)
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)) == 120 == manifest["row_count"]
    by_key = {r["key"]: r for r in rows}
    assert by_key["k010"]["version"] == 2 and by_key["k010"]["completion_tokens"] == 9010
    assert by_key["k005"]["version"] == 1 and by_key["k005"]["completion_tokens"] == 5005
    assert by_key["k001"]["version"] == 0
    assert manifest["versions"] == {"0": 96, "1": 12, "2": 12}
    assert manifest["budgets"] == {"16384": 12, "4096": 96, "8192": 12}
    assert manifest["finish_reasons"] == {"stop": 120}
    assert manifest["source_data_rows"] == 156 and manifest["source_data_files"] == 5  # 156 / 37
    assert manifest["open_failures"] == 1
    assert pq.read_schema(root / "final" / manifest["files"][0]["name"]).equals(
        DATA, check_metadata=False)


def test_manifest_checksums_match_files_and_parts_are_bounded(store):
    build_run(store)
    manifest = finalize.finalize(store, rows_per_file=50, allow_partial=True)
    final = Path(store.root.path) / "final"
    assert [f["rows"] for f in manifest["files"]] == [50, 50, 20]
    for entry in manifest["files"]:
        data = (final / entry["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data) == entry["bytes"]
        assert pq.read_metadata(final / entry["name"]).num_rows == entry["rows"]
    assert sorted(p.name for p in final.glob("*.parquet")) == [f["name"] for f in
                                                              manifest["files"]]


def test_rerun_gives_the_same_result(store):
    build_run(store)
    first = finalize.finalize(store, rows_per_file=50, allow_partial=True)
    on_disk = json.loads((Path(store.root.path) / "final" / "manifest.json").read_text())
    assert on_disk == first
    second = finalize.finalize(store, rows_per_file=50, allow_partial=True)
    first.pop("created_at"), second.pop("created_at")
    assert first == second


def test_rerun_with_larger_parts_removes_stale_files(store):
    build_run(store)
    finalize.finalize(store, rows_per_file=50, allow_partial=True)
    manifest = finalize.finalize(store, rows_per_file=1000, allow_partial=True)
    final = Path(store.root.path) / "final"
    assert [p.name for p in final.glob("*.parquet")] == ["part-00000.parquet"]
    assert manifest["files"][0]["rows"] == 120


def test_refuses_a_running_run_unless_forced(store, capsys):
    build_run(store)
    write_json_atomic(store.loc("progress.json"), {"status": "running", "updated_at": 0})
    with pytest.raises(SystemExit) as exc:
        finalize.main([store.root.path])
    assert exc.value.code == 1
    assert "still running" in capsys.readouterr().err
    assert not (Path(store.root.path) / "final").exists()
    assert finalize.main([store.root.path, "--force", "--allow-partial"]) == 0
    assert "120 rows" in capsys.readouterr().out


def test_empty_run_is_refused(store):
    write_rows(store, "failures", [failure_row("x", "EngineError")])
    with pytest.raises(finalize.FinalizeError, match="no rows in data"):
        finalize.finalize(store)


def test_incomplete_run_needs_allow_partial_and_records_what_is_missing(store, capsys):
    build_run(store)  # holds an open failure ("gone")
    write_json_atomic(store.loc("progress.json"), {"status": "stopped", "remaining": 7})
    with pytest.raises(SystemExit) as exc:
        finalize.main([store.root.path])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "--allow-partial" in err
    assert "last status stopped, 7 prompts without a result, 1 open failures" in err
    assert not (Path(store.root.path) / "final" / "manifest.json").exists()
    assert finalize.main([store.root.path, "--allow-partial"]) == 0
    assert "PARTIAL" in capsys.readouterr().out
    manifest = json.loads((Path(store.root.path) / "final" / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert manifest["missing"] == {"status": "stopped", "prompts_without_result": 7,
                                   "open_failures": 1}


def test_complete_run_is_marked_complete(store):
    write_rows(store, "data", [make_row(f"k{i}") for i in range(10)])
    write_json_atomic(store.loc("progress.json"), {"status": "succeeded", "remaining": 0})
    manifest = finalize.finalize(store)
    assert manifest["complete"] is True and manifest["missing"] is None


def test_run_without_progress_is_not_complete(store):
    write_rows(store, "data", [make_row(f"k{i}") for i in range(10)])
    with pytest.raises(finalize.FinalizeError, match="last status unknown"):
        finalize.finalize(store)
