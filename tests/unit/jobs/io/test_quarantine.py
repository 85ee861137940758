"""Damaged parts never crash a reader: garbage, a truncated part and a wrong-schema part
are moved to <run>/quarantine/ with their reason, read as no rows, and counted."""

from __future__ import annotations

import hashlib
import io
import json
import posixpath

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.analysis import finalize

from jobs.analysis import report

from jobs.analysis import status
from jobs.config import StorageConfig
from jobs.runs.progress import ProgressTracker
from jobs.pipeline.admission import key_digest
from jobs.io import index_compact
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore, part_name
from jobs.io.schema import DATA
from jobs.io.storage import write_bytes_atomic
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



def _plain_parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="none", write_statistics=False)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


NAMESAKE_KEYS = ["q0", "q1", "q2"]


def _namesakes(tmp_path) -> tuple[RunStore, str, bytes, pa.Table]:
    """A part with its sidecar, then damaged in place and quarantined, and a part of the
    same name and size written again (its rows regenerated and cut as before; other bytes)
    whose own sidecar is not written yet (the sink's window): the damaged part's sidecar
    is still in index/. Returns the store, the part's path, the new bytes and table."""
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    store.init_run_file()
    old_t, new_t = (pa.Table.from_pylist([make_row(k, latency_s=s) for k in NAMESAKE_KEYS],
                                         schema=DATA) for s in (1.0, 2.0))
    old, new = _plain_parquet(old_t), _plain_parquet(new_t)
    assert len(old) == len(new) and old != new  # same size: the listing cannot tell
    name = part_name(f"{k}:0:" for k in NAMESAKE_KEYS)
    path = store.loc("data", name).path
    store.write_sidecar("data", name, old_t, len(old), _sha(old))
    write_bytes_atomic(store.loc("data", name), old)
    return store, path, new, new_t


def test_a_sidecar_of_a_quarantined_namesake_is_not_believed(tmp_path):
    """Until the new part's sidecar is written, an index that read the damaged part's held
    its sha256, and finalize condemned the new, sound part as damaged (CI saw it:
    test_damaged_parts, "8 rows of 1 data part(s) were found damaged")."""
    store, path, new, _ = _namesakes(tmp_path)
    store.quarantine(path, "test: damaged in place")
    write_bytes_atomic(store.loc("data", posixpath.basename(path)), new)
    index = RunIndex.open(store)
    assert index.checksums[path] == _sha(new)
    assert finalize.finalize(store, allow_partial=True)["row_count"] == len(NAMESAKE_KEYS)
    assert store.quarantined() == [f"data/{posixpath.basename(path)}"]  # the first one only


def test_a_compact_object_covering_a_quarantined_namesake_is_not_used(tmp_path):
    """A compact object written while the damaged part was live covers its name and size:
    the part written again under that name must not take its sha256 from it."""
    store, path, new, new_t = _namesakes(tmp_path)
    assert index_compact.maybe_write(RunIndex.open(store))  # covers the first part
    store.quarantine(path, "test: damaged in place")
    name = posixpath.basename(path)
    write_bytes_atomic(store.loc("data", name), new)
    store.write_sidecar("data", name, new_t, len(new), _sha(new))
    index = RunIndex.open(store)
    assert index.reads["compact"] == 0  # not used: the sidecars answered
    assert index.checksums[path] == _sha(new)
