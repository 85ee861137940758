"""jobs.io.index_compact: one object per session holding what the run index's open
builds from the sidecars; used only when it still describes the run's listed parts."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.config import StorageConfig
from jobs.io import index_compact, run_index
from jobs.io.digests import digests_of
from jobs.io.part_summary import SERVED
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RUN_FILE, RunStore
from jobs.io.schema import DATA
from jobs.io.storage import list_files
from tests.support.run_rows import failure_row, make_row, reject_row, write_rows


@pytest.fixture
def store(tmp_path) -> RunStore:
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    store.init_run_file()  # salted, as every new run
    return store


def fill(store: RunStore, tag: str, n: int = 60) -> None:
    """Data rows (some continued to version 1, so latest-version picks matter), failures
    of keys later done and still open, rejects."""
    write_rows(store, "data", [make_row(f"{tag}{i}", category=f"c{i % 3}",
                                        finish_reason="length" if i % 4 else "stop",
                                        settings_hash=f"h{i % 2}") for i in range(n)],
               per_file=20)
    write_rows(store, "data", [make_row(f"{tag}{i}", 1, finish_reason="stop")
                               for i in range(0, n, 5)], per_file=20)
    write_rows(store, "failures", [failure_row(f"{tag}{i}", "engine_5xx") for i in (1, 900)])
    write_rows(store, "rejects", [reject_row(100 * ord(tag) + i, f"bad {tag}") for i in range(3)])


def picture(index: RunIndex) -> dict:
    """Everything an open answers, codes decoded (vocabularies may number differently)."""
    winners = {p: r.tolist() for p, r in index.winners_by_part().items()}
    latest = index.latest
    return {"done": latest["digest"].tolist(), "version": latest["version"].tolist(),
            "created": latest["created_ms"].tolist(), "tokens": latest["tokens"].tolist(),
            "prompt": latest["prompt"].tolist(),
            "finish": [index.finishes[c] for c in latest["finish"]],
            "settings": index.settings_of(np.arange(len(index.done))),
            "winners": winners, "open_failed": index.open_failed().tolist(),
            "failed": index.failed.tolist(), "rejects": sorted(index.reject_ids),
            "budgets": dict(index.first_budgets), "data_rows": index.data_rows,
            "seen": sorted(index.seen), "sizes": index.sizes, "checksums": index.checksums,
            "bytes": index.bytes_written, "last_write": index.last_write_ts}


def from_sidecars(store: RunStore, monkeypatch) -> RunIndex:
    with monkeypatch.context() as m:
        m.setenv("RAYGEN_INDEX_COMPACT", "0")
        return RunIndex.open(store)


def sidecar_reads(monkeypatch) -> list[str]:
    reads: list[str] = []
    real = run_index.read_bytes

    def read_bytes(loc):
        reads.append(loc.path)
        return real(loc)
    monkeypatch.setattr(run_index, "read_bytes", read_bytes)
    return reads


def test_an_open_reads_the_compact_object_and_only_the_sidecars_of_newer_parts(
        store, monkeypatch):
    fill(store, "a")
    first = index_compact.maybe_write(RunIndex.open(store))
    assert first.endswith("index/compact/00000001.arrow")
    fill(store, "b", 20)  # the next session's parts: 1 + 1 data, 1 failures, 1 rejects
    reads = sidecar_reads(monkeypatch)
    index = RunIndex.open(store)
    assert index.reads == {"compact": 1, "sidecar": 4} and len(reads) == 4
    assert picture(index) == picture(from_sidecars(store, monkeypatch))
    assert len(index.done) == 80 and len(index.open_failed()) == 2
    # The end of that session: a second object covering everything, the next open reads
    # no sidecar at all.
    assert index_compact.maybe_write(index).endswith("00000002.arrow")
    assert index_compact.maybe_write(index) is None  # nothing new since
    reads.clear()
    again = RunIndex.open(store)
    assert reads == [] and again.reads == {"compact": 1}
    assert picture(again) == picture(index)


def test_only_the_newest_two_are_kept(store):
    for tag in "abc":
        fill(store, tag, 20)
        index_compact.maybe_write(RunIndex.open(store))
    assert [n for n, _ in index_compact.listed(store)] == [3, 2]


@pytest.mark.parametrize("change", ["quarantined", "rewritten"])
def test_a_compact_object_covering_a_changed_part_is_not_used(store, monkeypatch, caplog,
                                                              change):
    fill(store, "a")
    index_compact.maybe_write(RunIndex.open(store))
    path = store.part_paths("data")[0]
    if change == "quarantined":
        store.quarantine(path, "test: damaged")
    else:  # another upload under the same name: other bytes and size
        table = store.read_part(path)
        pq.write_table(table.set_column(DATA.get_field_index("answer"), "answer", pa.array(
            ["a much longer answer"] * table.num_rows)), path)
    with caplog.at_level(logging.WARNING, "raygen"):
        index = RunIndex.open(store)
    assert "compact" not in index.reads
    assert "no longer listed" in caplog.text if change == "quarantined" else \
        "rewritten since" in caplog.text
    assert picture(index) == picture(from_sidecars(store, monkeypatch))
    if change == "quarantined":
        assert len(index.done) == 60 - 20 + 4  # that part's keys are not done (4 continued)


def test_an_older_object_serves_when_the_newest_is_unusable(store, monkeypatch, caplog):
    fill(store, "a")
    index_compact.maybe_write(RunIndex.open(store))
    fill(store, "b", 20)
    newest = store.loc(*index_compact.FOLDER, "00000002.arrow").path
    os.makedirs(os.path.dirname(newest), exist_ok=True)
    with open(newest, "wb") as f:
        f.write(b"not an arrow stream")
    reads = sidecar_reads(monkeypatch)
    with caplog.at_level(logging.WARNING, "raygen"):
        index = RunIndex.open(store)
    assert "00000002.arrow not used (unreadable" in caplog.text
    assert index.reads == {"compact": 1, "sidecar": 4} and len(reads) == 4
    assert picture(index) == picture(from_sidecars(store, monkeypatch))


def test_the_state_an_index_gives_is_what_another_applies_and_answers_the_same(
        store, monkeypatch):
    """What a compact object encodes and decodes (RunIndex.state / apply), without the
    object: the second index answers everything the first does."""
    fill(store, "a")
    fill(store, "b", 30)
    index = from_sidecars(store, monkeypatch)
    listing = {i.path: i for kind in ("data", "failures", "rejects")
               for i in list_files(store.loc(kind), ".parquet")}
    other = RunIndex(store)
    other.apply(index.state(), listing)
    assert picture(other) == picture(index)


def test_a_truncated_or_unknown_format_object_is_ignored_with_a_warning(store, monkeypatch,
                                                                        caplog):
    fill(store, "a")
    index = RunIndex.open(store)
    monkeypatch.setattr(index_compact, "FORMAT", "99")  # a newer raygen's
    index_compact.write(index)
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, "raygen"):
        assert "compact" not in RunIndex.open(store).reads
    assert "compact_format '99' is not one this raygen reads (1)" in caplog.text
    path = index_compact.write(index).removeprefix("file://")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) - 200])  # cut inside the last batch
    caplog.clear()
    with caplog.at_level(logging.WARNING, "raygen"):
        cut = RunIndex.open(store)
    assert "compact" not in cut.reads and "00000002.arrow not used" in caplog.text
    assert picture(cut) == picture(index)


def test_a_compact_object_of_another_salt_is_ignored(store, tmp_path, caplog):
    fill(store, "a")
    index_compact.maybe_write(RunIndex.open(store))
    run_file = tmp_path / "run" / RUN_FILE
    record = json.loads(run_file.read_text())
    run_file.write_text(json.dumps(dict(record, key_salt="ab" * 16)))
    resalted = RunStore(store.uri, StorageConfig())
    with caplog.at_level(logging.WARNING, "raygen"):
        index = RunIndex.open(resalted)
    assert "another salt than the run's" in caplog.text and "compact" not in index.reads
    keys = sorted(f"a{i}" for i in range(60))
    assert index.done.tolist() == sorted(digests_of(keys, resalted.key_salt).tolist())


def test_switched_off_nothing_is_written_or_read(store, monkeypatch):
    fill(store, "a", 20)
    index_compact.maybe_write(RunIndex.open(store))
    monkeypatch.setenv("RAYGEN_INDEX_COMPACT", "0")
    assert index_compact.maybe_write(RunIndex.open(store)) is None
    assert "compact" not in RunIndex.open(store).reads
    assert [n for n, _ in index_compact.listed(store)] == [1]


def test_a_write_that_fails_is_logged_not_raised(store, monkeypatch, caplog):
    fill(store, "a", 20)
    index = RunIndex.open(store)

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(index_compact, "write_local_durably", full)
    with caplog.at_level(logging.WARNING, "raygen"):
        assert index_compact.maybe_write(index) is None
    assert "compact index not written (OSError" in caplog.text
    assert index_compact.listed(store) == []


# --- the report's statistics beside each compact object ------------------------------

def stats_frame_of(parts) -> pd.DataFrame:
    frames = []
    for path, rows, table in parts:
        frame = table.to_pandas()
        frame.insert(0, "row", rows[:table.num_rows])
        frame.insert(0, "part", path)
        frames.append(frame)
    return pd.concat(frames).sort_values(["part", "row"]).reset_index(drop=True)


def stats_frame(index: RunIndex) -> pd.DataFrame:
    """Every key's latest row's report statistics, with its part and row, in one order."""
    return stats_frame_of(index.latest_stats(SERVED))


def test_the_report_reads_the_stats_object_and_only_the_sidecars_of_newer_parts(
        store, monkeypatch):
    fill(store, "a")
    index_compact.maybe_write(RunIndex.open(store))
    fill(store, "b", 20)
    # A later session continues keys of the covered parts: their latest rows move out.
    write_rows(store, "data", [make_row(f"a{i}", 2, finish_reason="stop", latency_s=7.0)
                               for i in range(0, 60, 10)], per_file=20)
    index = RunIndex.open(store)
    reads = sidecar_reads(monkeypatch)
    got = stats_frame(index)
    newer = len(store.part_paths("data")) - 4  # the first fill's 3 + 1 data parts
    assert len(reads) == newer and all("/index/data/" in r for r in reads)
    assert index.reads["report_compact"] == 4 and index.reads["report_sidecar"] == newer
    assert "report_part" not in index.reads
    pd.testing.assert_frame_equal(got, stats_frame(from_sidecars(store, monkeypatch)))
    assert (got[got.version == 2].latency_s == 7.0).all() and (got.version == 2).sum() == 6
    # The session's end writes the next pair: the next report reads no sidecar at all.
    index_compact.maybe_write(index)
    reads.clear()
    again = RunIndex.open(store)
    pd.testing.assert_frame_equal(stats_frame(again), got)
    assert again.reads["report_compact"] == len(store.part_paths("data")) and reads == []


@pytest.mark.parametrize("damage", ["truncated", "another object's", "missing", "format 1"])
def test_a_stats_object_that_is_not_its_compact_objects_is_not_used(store, monkeypatch,
                                                                    caplog, damage):
    fill(store, "a")
    index_compact.maybe_write(RunIndex.open(store))
    first = store.loc(*index_compact.FOLDER, "00000001.stats.arrow").path
    fill(store, "b", 20)
    index_compact.maybe_write(RunIndex.open(store))
    second = store.loc(*index_compact.FOLDER, "00000002.stats.arrow").path
    if damage == "truncated":
        data = open(second, "rb").read()
        open(second, "wb").write(data[:len(data) // 2])
    elif damage == "another object's":  # the previous session's, covering fewer parts
        open(second, "wb").write(open(first, "rb").read())
    elif damage == "format 1":  # the previous raygen's: without integrity_flags
        table = pa.ipc.open_file(open(second, "rb").read()).read_all()
        table = table.drop_columns(["integrity_flags"]).replace_schema_metadata(
            {**table.schema.metadata, b"stats_format": b"1"})
        with pa.OSFile(second, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    else:  # a compact object written by the raygen before the stats object
        os.unlink(second)
    index = RunIndex.open(store)
    with caplog.at_level(logging.WARNING, "raygen"):
        got = stats_frame(index)
    assert "report_compact" not in index.reads
    assert index.reads["report_sidecar"] == len(store.part_paths("data"))
    if damage in ("missing", "format 1"):  # an upgrade, not damage: no warning
        assert "statistics" not in caplog.text
    else:
        assert "00000002.stats.arrow not used" in caplog.text
    if damage == "another object's":
        assert "data_parts" in caplog.text and "compact" in caplog.text
    pd.testing.assert_frame_equal(got, stats_frame(from_sidecars(store, monkeypatch)))


def test_rows_missing_from_the_stats_object_are_read_from_their_sidecar():
    table = pa.table({"part": pa.array(["p1", "p1", "p2"]).dictionary_encode(),
                      "row": pa.array([0, 3, 1], pa.int32())})
    stats = index_compact.CompactStats(table)
    assert stats.positions("data/p1", np.array([0, 3])).tolist() == [0, 1]
    assert stats.positions("data/p2", np.array([1])).tolist() == [2]
    assert stats.positions("data/p1", np.array([1])) is None   # not a winner when written
    assert stats.positions("data/p1", np.array([3, 4])) is None
    assert stats.positions("data/p3", np.array([0])) is None   # a part it does not cover


def test_only_the_newest_two_stats_objects_are_kept(store):
    for tag in "abc":
        fill(store, tag, 20)
        index_compact.maybe_write(RunIndex.open(store))
    folder = os.path.dirname(store.loc(*index_compact.FOLDER, "x").path)
    assert sorted(os.listdir(folder)) == ["00000002.arrow", "00000002.stats.arrow",
                                          "00000003.arrow", "00000003.stats.arrow"]


def test_the_sessions_end_writes_the_stats_from_the_reports_own_read(store, monkeypatch):
    fill(store, "a")
    index = RunIndex.open(store)
    # right after an open: the compact object alone (its stats would cost every
    # sidecar's read again before the first request)
    index_compact.maybe_write(index, stats=False)
    folder = os.path.dirname(store.loc(*index_compact.FOLDER, "x").path)
    assert os.listdir(folder) == ["00000001.arrow"] and index.compact_number is None
    fill(store, "b", 20)
    reads = sidecar_reads(monkeypatch)
    index.refresh()
    opened = len(reads)
    report = stats_frame_of(index.latest_stats(SERVED, hold=True))  # the report
    parts = len(store.part_paths("data"))
    assert len(reads) - opened == parts  # no stats object yet: every sidecar
    index_compact.maybe_write(index)  # the end: the stats object from that same read
    assert len(reads) - opened == parts
    assert sorted(os.listdir(folder))[-2:] == ["00000002.arrow", "00000002.stats.arrow"]
    again = RunIndex.open(store)
    pd.testing.assert_frame_equal(stats_frame(again), report)
    assert again.reads["report_compact"] == parts

