"""Row-key digests are salted per run (jobs/io/digests.py, <run>/run.json): a colliding
pair of keys cannot be prepared before the run exists, and a run made before salts keeps
the unsalted digests its sidecars hold (an upgrade mid-run reads them as they are)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

from jobs.config import StorageConfig
from jobs.io import part_summary
from jobs.io.digests import digests_of, key_digest
from jobs.io.run_index import RunIndex, row_ids
from jobs.io.run_store import RUN_FILE, RunStore, UnknownRunFormat
from jobs.io.schema import DATA
from jobs.pipeline.admission import admit_inputs
from jobs.pipeline.admit_stage import admit_batch
from jobs.io.sources import ordinal_of
from jobs.io.storage import locate
from tests.support.run_rows import make_row

KEYS = [f"key-{i}" for i in range(200)]


def store_at(tmp_path, name="run") -> RunStore:
    return RunStore(str(tmp_path / name), StorageConfig())


def write(store: RunStore, keys: list[str]) -> str:
    table = pa.Table.from_pylist([make_row(k) for k in keys], schema=DATA)
    name = store.write_part("data", table, row_ids("data", table))
    return store.loc("data", name).path


def as_format_2(store: RunStore, part_path: str) -> None:
    """Rewrite the part's sidecar as raygen before salts wrote it (format 2, no salt id)."""
    side = store.sidecar_loc("data", os.path.basename(part_path)).path
    table = pa.ipc.open_file(pa.py_buffer(open(side, "rb").read())).read_all()
    meta = {k: v for k, v in table.schema.metadata.items() if k != b"key_salt_id"}
    with open(side, "wb") as f:
        f.write(part_summary.encode(table.replace_schema_metadata(dict(meta, format="2"))))


def test_a_new_run_gets_its_own_random_salt_and_keeps_it(tmp_path):
    a, b = store_at(tmp_path, "a"), store_at(tmp_path, "b")
    first = a.init_run_file()
    assert first["run_format"] == 3 and len(bytes.fromhex(first["key_salt"])) == 16
    b.init_run_file()
    assert a.key_salt != b.key_salt  # each run its own
    assert store_at(tmp_path, "a").key_salt == a.key_salt  # the next session reads it
    assert a.init_run_file() == first  # written once, never replaced
    # The same key has unrelated digests in two runs, and neither is the unsalted one.
    da, db, plain = (digests_of(KEYS, a.key_salt), digests_of(KEYS, b.key_salt),
                     digests_of(KEYS))
    assert not (da == db).any() and not (da == plain).any()


def test_a_salted_runs_sidecars_index_and_admission_agree(tmp_path):
    store = store_at(tmp_path)
    store.init_run_file()
    write(store, KEYS[:100])
    index = RunIndex.open(store)
    assert index.reads["sidecar"] == 1 and index.reads.get("part", 0) == 0
    assert sorted(index.done.tolist()) == sorted(key_digest(k, store.key_salt)
                                                 for k in KEYS[:100])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": k, "messages": [
        {"role": "user", "content": f"q {k}"}]}) + "\n" for k in KEYS))
    admission = admit_inputs([locate(str(prompts), StorageConfig())], index, False,
                             lambda part: None)
    assert len(admission.table) == 100 and admission.held == 100
    assert admission.table.salt == store.key_salt  # what the admit stage's workers hash with
    # The admit stage keeps exactly the rows the table chose, hashing with its salt.
    batch = pa.table({"key": KEYS,
                      "ordinal": pa.array([ordinal_of(0, n) for n in range(1, len(KEYS) + 1)],
                                          pa.int64()),
                      "reject_reason": pa.array([None] * len(KEYS), pa.string())})
    kept = admit_batch(batch, admission.table)
    assert kept.column("key").to_pylist() == KEYS[100:]


def test_a_run_made_before_salts_keeps_its_unsalted_digests(tmp_path):
    store = store_at(tmp_path)
    parts = [write(store, KEYS[:50]), write(store, KEYS[50:100])]  # no run.json yet
    for path in parts:
        as_format_2(store, path)
    record = store_at(tmp_path).init_run_file()  # the first session after the upgrade
    assert record == {"run_format": 2, "key_salt": ""}
    upgraded = store_at(tmp_path)
    index = RunIndex.open(upgraded)
    assert index.reads["sidecar"] == 2 and index.reads.get("part", 0) == 0  # read as they are
    assert sorted(index.done.tolist()) == sorted(key_digest(k) for k in KEYS[:100])
    write(upgraded, KEYS[100:120])  # a new part of the old run: format 3, still unsalted
    index.refresh()
    assert len(index.done) == 120 and index.reads.get("part", 0) == 0


def test_a_sidecar_of_another_salt_is_rebuilt_from_its_part_not_trusted(tmp_path):
    store = store_at(tmp_path)
    part = write(store, KEYS[:10])  # sidecar with unsalted digests
    with open(os.path.join(store.root.path, RUN_FILE), "w") as f:  # a run.json that says
        json.dump({"run_format": 3, "key_salt": "ab" * 16}, f)   # a salt (made by hand, say)
    store = store_at(tmp_path)
    assert store.key_salt == bytes.fromhex("ab" * 16)
    index = RunIndex.open(store_at(tmp_path))
    assert index.reads["part"] == 1  # rebuilt, with the run's salt
    assert sorted(index.done.tolist()) == sorted(key_digest(k, store.key_salt)
                                                 for k in KEYS[:10])
    side = store.sidecar_loc("data", os.path.basename(part)).path
    part_summary.decode(open(side, "rb").read(), "data", os.path.getsize(part),
                        store.key_salt)  # written back with the salt
    with pytest.raises(part_summary.BadSidecar, match="another salt"):
        part_summary.decode(open(side, "rb").read(), "data", os.path.getsize(part))


@pytest.mark.parametrize("content", ['{"run_format": 99, "key_salt": ""}', '["x"]'])
def test_a_run_file_of_an_unknown_format_is_refused_by_name(tmp_path, content):
    store = store_at(tmp_path)
    os.makedirs(store.root.path, exist_ok=True)
    with open(os.path.join(store.root.path, RUN_FILE), "w") as f:
        f.write(content)
    with pytest.raises(UnknownRunFormat, match=r"run\.json has run_format .*this raygen reads 2, 3"):
        store.init_run_file()
