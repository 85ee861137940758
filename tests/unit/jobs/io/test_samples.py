"""jobs.io.samples: (key, sample) identities, row ids and seeds; a sample's rows in the
run index are its own (done, versions, failures), and n = 1 rows are what they were."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.config import StorageConfig
from jobs.io import part_summary
from jobs.io.digests import digests_of
from jobs.io.run_index import RunIndex, row_ids
from jobs.io.run_store import RunStore
from jobs.io.samples import identity_digests, row_key, sample_digests, sample_seed
from jobs.io.schema import DATA, FAILURES
from tests.support.run_rows import failure_row, make_row, write_rows

SALT = bytes(range(16))


def test_sample_zero_and_null_keep_the_keys_digest():
    keys = [f"k{i}" for i in range(50)]
    plain = digests_of(keys, SALT)
    assert np.array_equal(sample_digests(plain, 0), plain)
    assert np.array_equal(identity_digests(keys, None, SALT), plain)
    assert np.array_equal(identity_digests(keys, [None] * 50, SALT), plain)
    assert np.array_equal(identity_digests(keys, [0] * 50, SALT), plain)


def test_identities_of_many_keys_and_samples_are_distinct():
    plain = digests_of([f"k{i}" for i in range(20_000)], SALT)
    ids = np.concatenate([sample_digests(plain, s) for s in range(8)])
    assert len(np.unique(ids)) == len(ids)
    # an array of samples gives each row its own mix, as the per-sample calls do
    mixed = sample_digests(plain[:8], np.arange(8))
    assert [int(mixed[s]) for s in range(8)] == [int(sample_digests(plain[s:s + 1], s)[0])
                                                  for s in range(8)]


def test_row_ids_of_samples_never_collide_and_n1_ids_are_unchanged():
    assert row_key("a", None) == row_key("a", 0) == "a"
    rows = [make_row("a"), make_row("a", sample=1), make_row("a", sample=2)]
    ids = row_ids("data", pa.Table.from_pylist(rows, schema=DATA))
    assert ids[0] == "a#0" and len(set(ids)) == 3


def test_seeds_are_stable_distinct_per_sample_and_per_run_and_fit_sglang():
    seeds = {sample_seed(SALT, f"k{i}", s) for i in range(500) for s in range(4)}
    assert len(seeds) == 2000
    assert all(0 <= x < 2 ** 63 for x in seeds)  # SGLang: [-2**63, 2**63 - 1]
    assert sample_seed(SALT, "k1", 2) == sample_seed(SALT, "k1", 2)
    assert sample_seed(SALT, "k1", 2) != sample_seed(bytes(16), "k1", 2)
    # pinned: a resumed run sends each sample the seed its first session chose
    assert sample_seed(SALT, "q-000017", 3) == 2439697494408770824


@pytest.fixture
def store(tmp_path) -> RunStore:
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    store.init_run_file()
    return store


def test_the_index_holds_each_sample_as_its_own_key(store):
    rows = [make_row(k, sample=s, seed=sample_seed(store.key_salt, k, s))
            for k in ("a", "b") for s in range(4)]
    rows.append(make_row("a", version=1, sample=2, finish_reason="stop"))  # a continued one
    write_rows(store, "data", rows, per_file=3)
    write_rows(store, "failures", [dict(failure_row("c", "engine_5xx"), sample=1)])
    index = RunIndex.open(store)
    assert len(index.done) == 8 and index.data_rows == 9
    salt = store.key_salt
    want = {int(d) for k in ("a", "b") for s in range(4)
            for d in sample_digests(digests_of([k], salt), s)}
    assert set(index.done.tolist()) == want
    a2 = int(sample_digests(digests_of(["a"], salt), 2)[0])
    pos = int(np.searchsorted(index.done, a2))
    assert index.latest["version"][pos] == 1  # sample 2's own latest, not a's others
    assert index.open_failed().tolist() == sample_digests(digests_of(["c"], salt), 1).tolist()


def test_parts_written_before_the_column_read_as_sample_zero(store):
    old = pa.Table.from_pylist([make_row("a")], schema=DATA).drop_columns(["sample", "seed"])
    store.root.fs.create_dir(store.loc("data").path)  # its sidecar is rebuilt from it
    pq.write_table(old, store.loc("data", "part-old.parquet").path)
    index = RunIndex.open(store)
    assert index.done.tolist() == digests_of(["a"], store.key_salt).tolist()
    back = store.read_part(index.part_paths[0])
    assert back.column("sample").to_pylist() == [None] and back.column("seed").null_count == 1
    summary = part_summary.summarize("failures", pa.Table.from_pylist(
        [failure_row("a", "x")], schema=FAILURES).drop_columns(["sample"]), 1, salt=b"")
    assert summary.column("digest").to_pylist() == digests_of(["a"]).tolist()
