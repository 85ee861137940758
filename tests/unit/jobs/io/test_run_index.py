"""jobs.io.run_index: the one read model of a run, from the parts' sidecars."""

from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pyarrow as pa
import pytest

from jobs.config import StorageConfig
from jobs.io import part_summary, run_index
from jobs.io.digests import key_digest
from jobs.io.run_index import RunIndex, latest_rows, row_ids
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA, FAILURES, REJECTS
from jobs.runs.continuation import rows_to_read, to_continue
from tests.support.run_rows import T0, failure_row, make_row

SCHEMAS = {"data": DATA, "failures": FAILURES, "rejects": REJECTS}


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(str(tmp_path / "run"), StorageConfig())


def write(store: RunStore, kind: str, rows: list[dict]) -> str:
    """One part, written as the sink writes it (part, then sidecar); its path."""
    table = pa.Table.from_pylist(rows, schema=SCHEMAS[kind])
    name = store.write_part(kind, table, row_ids(kind, table))
    return store.loc(kind, name).path


def sidecar_path(store: RunStore, part_path: str) -> str:
    kind = os.path.basename(os.path.dirname(part_path))
    return store.sidecar_loc(kind, os.path.basename(part_path)).path


class Reads:
    """Counts what the index reads: sidecars (read_bytes) and parts (read_part)."""

    def __init__(self, monkeypatch, store: RunStore):
        self.sidecars, self.parts = [], []
        real_bytes, real_part = run_index.read_bytes, store.read_part

        def read_bytes(loc):
            self.sidecars.append(loc.path)
            return real_bytes(loc)

        def read_part(path, columns=None):
            self.parts.append(path)
            return real_part(path, columns)
        monkeypatch.setattr(run_index, "read_bytes", read_bytes)
        monkeypatch.setattr(store, "read_part", read_part)


def latest_of(index: RunIndex, key: str) -> tuple[int, str, int]:
    """(version, part path, row) of the key's latest row."""
    i = int(np.searchsorted(index.done, np.uint64(key_digest(key))))
    assert index.done[i] == key_digest(key)
    return (int(index.latest["version"][i]), index.part_paths[index.latest["part"][i]],
            int(index.latest["row"][i]))


# --- the one tie-break rule --------------------------------------------------------

def test_latest_is_the_highest_version_then_created_at_then_part_path_then_row(store):
    later = T0 + dt.timedelta(seconds=5)
    first = write(store, "data", [make_row("v", 1, created_at=T0),
                                  make_row("c", 0, created_at=later)])
    write(store, "data", [make_row("v", 0, created_at=later), make_row("c", 0, created_at=T0)])
    tied = [write(store, "data", [make_row("t", 0, created_at=T0), make_row(f"x{i}")])
            for i in range(3)]  # x: other row ids, so another part name
    assert len(set(tied)) == 3
    rows = write(store, "data", [make_row("r", 0, created_at=T0, answer=str(i))
                                 for i in range(3)])
    index = RunIndex.open(store)
    assert latest_of(index, "v") == (1, first, 0)          # version beats created_at
    assert latest_of(index, "c") == (0, first, 1)          # then the later created_at
    assert latest_of(index, "t")[1] == max(tied)           # then the last part path
    assert latest_of(index, "r") == (0, rows, 2)           # then the last row
    assert len(index.done) == 7 and index.data_rows == 13


def test_incremental_refresh_applies_the_same_rule_as_a_fresh_open(store):
    """Parts arriving one refresh at a time (an exact tie against a held row compares
    part paths) pick the same winners as one open of all of them."""
    stepwise = RunIndex(store)
    for i in range(4):
        write(store, "data", [make_row("t", 0, created_at=T0, answer=str(i)),
                              make_row(f"k{i}", i % 2)])
        stepwise.refresh()
    fresh = RunIndex.open(store)
    assert {p: r.tolist() for p, r in stepwise.winners_by_part().items()} == \
        {p: r.tolist() for p, r in fresh.winners_by_part().items()}


def test_later_compares_column_by_column_and_builds_a_costly_one_for_exact_ties_only():
    asked = []

    def paths(names):
        def column(tied):
            asked.append(tied.tolist())
            return np.array([names[i] for i in tied], object)
        return column
    a = [[2, 1, 1, 1, 1], [0, 9, 5, 5, 5], paths("zzbaa"), [0, 0, 0, 0, 3]]
    b = [[1, 1, 1, 1, 1], [9, 5, 5, 5, 5], paths("aaabb"), [9, 9, 9, 0, 1]]
    assert run_index.later(a, b).tolist() == [True, True, True, False, False]
    assert asked == [[2, 3, 4], [2, 3, 4]]  # rows 0 and 1 were decided before the paths
    # a prefix of the rule (the export journal's version, created_at): equal is not later
    assert run_index.later(a[:2], b[:2]).tolist() == [True, True, False, False, False]


def test_by_part_groups_any_positions_by_the_part_holding_them_in_row_order(store):
    a = write(store, "data", [make_row(k) for k in ("a0", "a1", "a2")])
    b = write(store, "data", [make_row(k) for k in ("b0", "b1")])
    index = RunIndex.open(store)
    at = {k: int(np.searchsorted(index.done, np.uint64(key_digest(k))))
          for k in ("a0", "a1", "a2", "b0", "b1")}
    picked = np.array([at["b1"], at["a2"], at["a0"]])
    assert {p: g.tolist() for p, g in index.by_part(picked)} == {
        a: [at["a0"], at["a2"]], b: [at["b1"]]}
    assert {p: r.tolist() for p, r in index.winners_by_part().items()} == {
        a: [0, 1, 2], b: [0, 1]}


def test_latest_rows_of_a_frame_is_the_same_rule():
    df = pa.Table.from_pylist([make_row("a", 1, created_at=T0),
                               make_row("a", 1, created_at=T0 + dt.timedelta(seconds=1),
                                        answer="later"),
                               make_row("a", 0, created_at=T0 + dt.timedelta(seconds=9)),
                               make_row("b", 0)], schema=DATA).to_pandas()
    out = latest_rows(df).set_index("key")
    assert out.loc["a", "answer"] == "later" and len(out) == 2


# --- sidecars: cheap to open, the part stays the truth ------------------------------

def test_open_reads_sidecars_not_parts(store, monkeypatch):
    paths = [write(store, "data", [make_row(f"k{i}")]) for i in range(5)]
    reads = Reads(monkeypatch, store)
    index = RunIndex.open(store)
    assert len(index.done) == 5
    assert sorted(reads.sidecars) == sorted(sidecar_path(store, p) for p in paths)
    assert reads.parts == []


def test_missing_sidecar_after_a_crash_is_rebuilt_from_its_part_and_written_back(
        store, monkeypatch):
    kept = write(store, "data", [make_row("a")])
    crashed = write(store, "data", [make_row("b", finish_reason="length",
                                             completion_tokens=77)])
    os.remove(sidecar_path(store, crashed))  # the writer died between part and sidecar
    reads = Reads(monkeypatch, store)
    index = RunIndex.open(store)
    assert reads.parts == [crashed] and reads.sidecars == [sidecar_path(store, kept)]
    assert len(index.done) == 2 and index.truncated == 1 and index.output_tokens == 1077
    assert os.path.exists(sidecar_path(store, crashed))
    again = Reads(monkeypatch, store)
    RunIndex.open(store)
    assert again.parts == []  # the rebuilt sidecar serves the next open


@pytest.mark.parametrize("damage", ["garbage", "stale"])
def test_unreadable_or_stale_sidecar_is_rebuilt(store, monkeypatch, damage):
    path = write(store, "data", [make_row("a")])
    side = sidecar_path(store, path)
    if damage == "garbage":
        open(side, "wb").write(b"not arrow")
    else:  # the sidecar of an earlier upload under the same name: another size
        other = part_summary.summarize("data", pa.Table.from_pylist(
            [make_row("zzz")], schema=DATA), os.path.getsize(path) + 1)
        open(side, "wb").write(part_summary.encode(other))
    reads = Reads(monkeypatch, store)
    index = RunIndex.open(store)
    assert reads.parts == [path]
    assert index.done.tolist() == [key_digest("a")]
    part_summary.decode(open(side, "rb").read(), "data", os.path.getsize(path))  # good now


def test_sidecar_of_a_quarantined_part_is_ignored(store):
    write(store, "data", [make_row("a")])
    bad = write(store, "data", [make_row("b")])
    store.quarantine(bad, "test: damaged")
    assert os.path.exists(sidecar_path(store, bad))  # left behind, never read
    index = RunIndex.open(store)
    assert index.done.tolist() == [key_digest("a")]


def test_damaged_part_without_sidecar_is_quarantined_and_not_done(store):
    write(store, "data", [make_row("a")])
    with open(store.loc("data", "part-bad.parquet").path, "wb") as f:
        f.write(b"PAR1 garbage")
    index = RunIndex.open(store)
    assert index.done.tolist() == [key_digest("a")] and index.quarantined == 1
    assert store.quarantined() == ["data/part-bad.parquet"]
    assert not os.path.exists(store.sidecar_loc("data", "part-bad.parquet").path)


# --- incremental --------------------------------------------------------------------

def test_refresh_reads_only_new_parts(store, monkeypatch):
    for i in range(3):
        write(store, "data", [make_row(f"k{i}")])
    index = RunIndex.open(store)
    reads = Reads(monkeypatch, store)
    assert index.refresh() == 0 and reads.sidecars == [] and reads.parts == []
    new = write(store, "failures", [failure_row("k9", "engine_5xx")])
    assert index.refresh() == 1
    assert reads.sidecars == [sidecar_path(store, new)] and reads.parts == []
    assert index.open_failed().tolist() == [key_digest("k9")]


def test_failures_rejects_and_events(store):
    write(store, "data", [make_row("a", retry_classes=["engine_5xx"])])
    write(store, "failures", [failure_row("a", "x"), failure_row("f", "continuation:y")])
    write(store, "rejects", [{"source": "in.jsonl", "line": 3, "reason": "duplicate id 'a'",
                              "reject_id": "dup:1#2", "rejected_at": T0},
                             {"source": "in.jsonl", "line": 4, "reason": "not valid JSON",
                              "rejected_at": T0}])
    index = RunIndex.open(store)
    assert index.open_failed().tolist() == [key_digest("f")]  # "a" is done
    assert index.reject_ids == {"dup:1#2", "in.jsonl:4"}
    assert sorted(index.take_events()) == sorted(
        [("retries", "engine_5xx")] + [("retries", "engine_5xx")] * 6
        + [("failures", "x"), ("failures", "y"),
           ("rejects", "duplicate_id"), ("rejects", "invalid_json")])
    assert index.take_events() == []


# --- memory and collisions ----------------------------------------------------------

def test_keys_are_held_as_fixed_size_arrays(store):
    write(store, "data", [make_row(f"key-{i:06d}" * 5) for i in range(2000)])
    index = RunIndex.open(store)
    per_key = sum(a.itemsize for a in index.latest.values())
    assert per_key == 43 and index.nbytes == 2000 * per_key
    assert np.all(index.done[1:] > index.done[:-1])  # sorted, unique: searchsorted works


def test_two_keys_with_one_digest_count_as_one_key(store, monkeypatch):
    """Stated: a digest collision (p ~ n^2/2^65) merges two keys in the index; the later
    row wins as if it were a newer row of the same key, the other counts as done."""
    monkeypatch.setattr(part_summary, "digests_of",  # every key the same digest
                        lambda keys, salt=b"": np.full(len(list(keys)), 7, np.uint64))
    write(store, "data", [make_row("a", created_at=T0)])
    write(store, "data", [make_row("b", created_at=T0 + dt.timedelta(seconds=1))])
    index = RunIndex.open(store)
    assert index.done.tolist() == [7] and index.data_rows == 2


# --- continuation reads only what it continues --------------------------------------

def test_continuation_reads_only_parts_with_rows_to_continue(store):
    write(store, "data", [make_row("done")])
    cut = write(store, "data", [make_row("cut", finish_reason="length", completion_tokens=10)])
    write(store, "data", [make_row("cut-done", finish_reason="length"),
                          make_row("cut-done", 1, finish_reason="stop")])
    index = RunIndex.open(store)
    wanted = to_continue(index, 8192)
    assert wanted.tolist() == [key_digest("cut")]
    assert rows_to_read(index, wanted) == {cut: [0]}


def test_a_row_stored_twice_is_continued_once(store):
    """The same (key, version) in two parts (a part written again after a crash, under
    another name): the continuation reads the index's winner only, never both copies."""
    row = make_row("cut", finish_reason="length", completion_tokens=10)
    first = write(store, "data", [make_row("x"), row])
    second = write(store, "data", [row, make_row("y")])
    index = RunIndex.open(store)
    wanted = to_continue(index, 8192)
    chosen = rows_to_read(index, wanted)
    assert sum(len(rows) for rows in chosen.values()) == 1, chosen
    assert chosen in ({first: [1]}, {second: [0]})


def test_an_open_merged_in_chunks_picks_the_same_rows(store, monkeypatch):
    for i in range(6):
        write(store, "data", [make_row("t", i % 3, created_at=T0, answer=str(i)),
                              make_row(f"k{i}", 0), make_row(f"k{i + 1}", 1)])
    whole = RunIndex.open(store)
    monkeypatch.setattr(run_index, "MERGE_ROWS", 2)  # a merge after every part
    chunked = RunIndex.open(store)
    assert {k: v.tolist() for k, v in chunked.latest.items()} == \
        {k: v.tolist() for k, v in whole.latest.items()}


def test_a_part_written_again_under_a_quarantined_parts_name_is_read(store):
    """The next session regenerates a quarantined part's rows, often into a part of the
    same name: the index that saw the damaged one must read the new one."""
    rows = [make_row("a"), make_row("b")]
    path = write(store, "data", rows)
    with open(path, "wb") as f:
        f.write(b"PAR1 garbage")  # damaged in place: the sidecar no longer fits
    index = RunIndex.open(store)
    assert len(index.done) == 0 and index.quarantined == 1
    assert write(store, "data", rows) == path
    assert index.refresh() == 1 and len(index.done) == 2
