"""Damaged parts never crash a reader: garbage, a truncated part and a wrong-schema part
are moved to <run>/quarantine/ with their reason, read as no rows, and counted."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.analysis import finalize

from jobs.analysis import report

from jobs.analysis import status
from jobs.config import StorageConfig
from jobs.runs.progress import ProgressTracker
from jobs.pipeline.admission import key_digest
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from tests.support.run_rows import failure_row, make_row, write_rows

GOOD_KEYS = [f"k{i:02d}" for i in range(12)]


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def damaged_run(tmp_path) -> tuple[RunStore, dict[str, str]]:
    """A run with 12 good rows in 3 parts plus 3 damaged data parts (and one damaged
    failures part); returns the store and {damaged part name: what is wrong}."""
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    write_rows(store, "data", [make_row(k) for k in GOOD_KEYS], per_file=4)
    good_part = open(store.part_paths("data")[0], "rb").read()
    damage = {
        "part-garbage.parquet": b"1000;chunk-signature=abc\r\n" + b"\x00" * 500 + b"=\r\n\r\n",
        "part-truncated.parquet": good_part[: len(good_part) // 2],
        "part-wrongschema.parquet": _parquet_bytes(pa.table({"x": [1, 2], "y": ["a", "b"]})),
    }
    for name, data in damage.items():
        (tmp_path / "run" / "data" / name).write_bytes(data)
    (tmp_path / "run" / "failures").mkdir()
    (tmp_path / "run" / "failures" / "part-garbage.parquet").write_bytes(b"PAR1 nope")
    return store, damage


def _assert_quarantined(store: RunStore, tmp_path, damage: dict[str, str]) -> None:
    assert sorted(store.quarantined()) == sorted(
        [f"data/{n}" for n in damage] + ["failures/part-garbage.parquet"])
    for name in damage:
        assert not (tmp_path / "run" / "data" / name).exists()
        reason = json.loads((tmp_path / "run" / "quarantine" / "data" /
                             f"{name}.reason.json").read_text())
        assert reason["part"] == f"data/{name}" and reason["reason"]
    wrong = json.loads((tmp_path / "run" / "quarantine" / "data" /
                        "part-wrongschema.parquet.reason.json").read_text())
    assert "wrong schema" in wrong["reason"] and "key" in wrong["reason"]
    # The good parts stay where they were, untouched.
    assert len(store.part_paths("data")) == 3


def test_resume_state_skips_damaged_parts(tmp_path):
    store, damage = damaged_run(tmp_path)
    index = RunIndex.open(store)
    # the damaged parts' rows are not done
    assert sorted(index.done.tolist()) == sorted(key_digest(k) for k in GOOD_KEYS)
    _assert_quarantined(store, tmp_path, damage)


def test_progress_counts_quarantined_parts_and_status_shows_them(tmp_path, capsys):
    store, damage = damaged_run(tmp_path)
    snap = ProgressTracker(store, total=20, run="r", model="m", interval_s=60).update()
    assert snap["completed"] == 12 and snap["quarantined_parts"] == 4
    assert snap["remaining"] == 8
    _assert_quarantined(store, tmp_path, damage)
    assert status.main([store.uri]) == 0
    assert "damaged    4 part(s) moved to <run>/quarantine/" in capsys.readouterr().out


def test_report_reads_around_damaged_parts(tmp_path):
    store, damage = damaged_run(tmp_path)
    built = report.build_report(store)
    assert built["keys"] == 12
    _assert_quarantined(store, tmp_path, damage)


def test_finalize_reads_around_damaged_parts(tmp_path):
    store, damage = damaged_run(tmp_path)
    manifest = finalize.finalize(store, allow_partial=True)  # no progress.json here
    assert manifest["row_count"] == 12
    _assert_quarantined(store, tmp_path, damage)
    final = pa.concat_tables(pq.read_table(p) for p in
                             sorted((tmp_path / "run" / "final").glob("*.parquet")))
    assert sorted(final.column("key").to_pylist()) == GOOD_KEYS


def test_a_part_quarantined_by_another_reader_meanwhile_reads_as_no_rows(tmp_path):
    store, _ = damaged_run(tmp_path)
    path = str(tmp_path / "run" / "data" / "part-garbage.parquet")
    store.quarantine(path, "test")
    assert store.read_part(path, ["key"]).num_rows == 0  # gone: no crash, no rows


def test_storage_errors_are_not_damage(tmp_path):
    """Only bad bytes are quarantined: a part we cannot open at all (here: a folder
    where the part should be) raises and stays put."""
    store, _ = damaged_run(tmp_path)
    odd = tmp_path / "run" / "data" / "part-dir.parquet"
    odd.mkdir()
    with pytest.raises(OSError):
        store.read_part(str(odd), ["key"])
    assert odd.exists()


def test_overlapping_updates_count_each_part_once(tmp_path, monkeypatch):
    """The driver's last update and the progress thread's may run at once (the live
    metrics test saw failures and retries counted twice)."""
    import threading
    import time as _time

    store, _ = damaged_run(tmp_path)
    for i in range(4):  # failures with retries: the outcome counters' events
        write_rows(store, "failures", [failure_row(f"f{i}", "engine_5xx")])

    class Counter:
        def __init__(self):
            self.events = []

        def set(self, snapshot):
            pass

        def count(self, events):
            self.events += events

    gauges = Counter()
    tracker = ProgressTracker(store, total=20, run="r", model="m", interval_s=60,
                              gauges=gauges)
    tracker._counting = True  # count from the first scan: every part is "new" here
    slow_read = store.read_part

    def read_part(path, columns=None):
        _time.sleep(0.05)  # widen the window in which both scans see the same new part
        return slow_read(path, columns)
    monkeypatch.setattr(store, "read_part", read_part)
    threads = [threading.Thread(target=tracker.update) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    single = ProgressTracker(store, total=20, run="r", model="m", interval_s=60)
    single.index.refresh()
    assert gauges.events and sorted(gauges.events) == sorted(single.index.events)
