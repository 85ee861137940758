"""A run on S3 with damaged parts (garbage, truncated, wrong schema) resumes: the parts
go to <run>/quarantine/ with their reasons, their rows are regenerated, progress and
status count them, and finalize holds every row once."""

from __future__ import annotations

import collections
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.analysis import finalize

from jobs.analysis import status
from jobs.io.storage import write_bytes_atomic
from tests.integration.helpers import run_config, write_prompts
from tests.integration.helpers import run, store_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 48


def _damage(store) -> dict[str, int]:
    """Overwrite three data parts in place; returns {part name: rows it held}."""
    paths = store.part_paths("data")[:3]
    assert len(paths) == 3
    held = {}
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": [1, 2, 3]}), buf)
    bodies = [b"1000;chunk-signature=0\r\n" + b"\x07" * 4096 + b"\r\n0\r\n\r\n",
              None, buf.getvalue()]
    for path, body in zip(paths, bodies):
        name = path.rsplit("/", 1)[1]
        with store.root.fs.open_input_file(path) as f:
            data = f.read()
        held[name] = pq.ParquetFile(io.BytesIO(data)).metadata.num_rows
        write_bytes_atomic(store.loc("data", name), data[: len(data) // 2] if body is None
                           else body)
    return held


def test_damaged_parts_are_quarantined_and_their_rows_regenerated(
        ray_cluster, s3_endpoint, tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", ROWS)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(prompts),
                      job={"rows_per_file": 8})
    assert run(tree).status == "succeeded"
    store = store_of(tree)
    held = _damage(store)

    summary = run(tree)  # resume: reads around the damaged parts, regenerates their rows
    assert summary.status == "succeeded"
    assert sorted(store.quarantined()) == sorted(f"data/{n}" for n in held)
    keys = collections.Counter()
    for path in store.part_paths("data"):
        keys.update(store.load_part(path, "data", ["key"]).column("key").to_pylist())
    assert set(keys) == {f"p{i:05d}" for i in range(ROWS)} and max(keys.values()) == 1
    progress = store.read_json("progress.json")
    assert progress["quarantined_parts"] == 3 and progress["completed"] == ROWS
    assert progress["session_rows"] == sum(held.values())  # exactly the lost rows
    assert progress["session_regenerated_damaged"] == sum(held.values())  # ... said so
    assert f"({sum(held.values())} lost to damaged parts)" in summary.text, summary.text

    capsys.readouterr()
    assert status.main([store.uri]) == 0
    assert "damaged    3 part(s)" in capsys.readouterr().out
    assert finalize.finalize(store)["row_count"] == ROWS
