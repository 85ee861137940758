"""RunIndex.open as the resume state: what admission reads from a run's files, including parts
written before prompt_hash / reject_id existed."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.pipeline.admission import key_digest
from jobs.config import StorageConfig
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA, FAILURES, REJECTS

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def write(store: RunStore, kind: str, schema: pa.Schema, rows: list[dict], name: str,
          drop: tuple[str, ...] = ()) -> None:
    cols = [f for f in schema if f.name not in drop]
    table = pa.table({f.name: [r.get(f.name) for r in rows] for f in cols},
                     schema=pa.schema(cols))
    path = store.loc(kind, name).path
    store.root.fs.create_dir(store.loc(kind).path)
    pq.write_table(table, path)


def data_row(key: str, version: int = 0, prompt_hash=None) -> dict:
    return {"key": key, "version": version, "settings_hash": "h", "budget_history": [64],
            "prompt_hash": prompt_hash, "created_at": T0}


def test_state_from_old_and_new_parts(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    write(store, "data", DATA, [data_row("a"), data_row("a", 1)], "part-old.parquet",
          drop=("prompt_hash",))  # written before prompt hashes
    write(store, "data", DATA, [data_row("b", prompt_hash="sha256:x")], "part-new.parquet")
    write(store, "failures", FAILURES, [{"key": "a", "failed_at": T0},
                                        {"key": "f", "failed_at": T0}], "part-f.parquet")
    write(store, "rejects", REJECTS, [{"source": "p.jsonl", "line": 3, "rejected_at": T0}],
          "part-r-old.parquet", drop=("reject_id",))
    write(store, "rejects", REJECTS, [{"source": "p.jsonl", "line": 4, "reject_id": "raw:z#1",
                                       "rejected_at": T0}], "part-r-new.parquet")
    index = RunIndex.open(store)
    assert sorted(index.done.tolist()) == sorted([key_digest("a"), key_digest("b")])
    by_key = dict(zip(index.done.tolist(), index.done_prompts.tolist()))
    assert by_key[key_digest("a")] == 0 and by_key[key_digest("b")] == key_digest("sha256:x")
    assert index.open_failed().tolist() == [key_digest("f")]  # "a" failed once, then done
    assert index.reject_ids == {"p.jsonl:3", "raw:z#1"}
    assert index.first_budgets == {("h", 64): 3}
    assert np.all(index.done[1:] > index.done[:-1])  # sorted, unique
    assert not store.part_paths("quarantine")  # a later column's absence is not damage
    assert len(store.part_paths("data")) == 2


def test_read_kind_of_an_empty_kind(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    table = store.read_kind("data", ["key", "prompt_hash"])
    assert table.num_rows == 0 and table.column_names == ["key", "prompt_hash"]
