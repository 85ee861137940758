"""The writer keeps to rows_per_file whatever block sizes Ray Data hands it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from jobs.config import StorageConfig
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA
from jobs.pipeline.sink import RunSink, slices
from tests.support.run_rows import make_row


@pytest.mark.parametrize("rows, per_file, sizes", [
    (24, 4, [4] * 6), (5, 256, [5]), (1, 1, [1]), (10, 4, [4, 3, 3]), (272, 256, [136, 136]),
    (400, 256, [200, 200]),
])
def test_slices_are_even_and_cover_every_row(rows, per_file, sizes):
    cut = slices(rows, per_file)
    assert [length for _, length in cut] == sizes
    assert [offset for offset, _ in cut] == [sum(sizes[:i]) for i in range(len(sizes))]


def test_one_large_block_is_written_as_parts_of_rows_per_file(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    table = pa.Table.from_pylist([make_row(f"k{i:02d}") for i in range(24)], schema=DATA)
    table = table.append_column("_kind", pa.array(["data"] * 24))
    written = RunSink(store.uri, StorageConfig(), rows_per_file=4).write([table], ctx=None)
    assert written == {"data": 24, "failures": 0}
    parts = store.part_paths("data")
    assert len(parts) == 6
    keys = sorted(k for p in parts for k in store.read_part(p).column("key").to_pylist())
    assert keys == [f"k{i:02d}" for i in range(24)]
    # a retried write of the same rows names the same parts (exactly-once)
    RunSink(store.uri, StorageConfig(), rows_per_file=4).write([table], ctx=None)
    assert sorted(store.part_paths("data")) == sorted(parts)
