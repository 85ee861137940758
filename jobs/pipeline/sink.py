"""Write stage output to the run prefix (stage 5 of the job): a Ray Data Datasink.

Row contract: reads STAGE_OUTPUT rows (``WRITE_INPUTS``: their ``_kind``, then each
kind's columns, ``KIND_INPUTS``; checked per block). Each write call gets at least
``rows_per_file`` rows (Ray Data bundles blocks up to it; a
block larger than that arrives whole), splits them by ``_kind``, cuts each kind into
even parts of at most ``rows_per_file`` rows (``slices``) and writes each as one immutable,
atomically-written Parquet file, named by a hash of its row ids
(run_index.row_ids), then the part's sidecar (jobs/io/part_summary.py) for the run index.
Data first, nothing after: a row is done exactly when its file exists, which is what
resume and progress read; ``write_part`` reads each part back (footer, row count) before
the task returns, so a part counts only once it is known whole. A retried write task
produces the same name and replaces its own file, so a row is never written twice.
"""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor

from jobs.config import StorageConfig
from jobs.io.run_store import RunStore
from jobs.io.schema import KINDS
from jobs.pipeline.stage_inputs import StageInputs

# What the generate stage hands over (schema.STAGE_OUTPUT): each row's destination, and
# for each destination its schema's columns (write_part writes exactly those).
WRITE_INPUTS = StageInputs("write", {"_kind": "where the row goes: data or failures"})
KIND_INPUTS = {kind: StageInputs(f"write {kind}/", {
    name: f"a column of {kind}/ (jobs/io/schema.py)" for name in KINDS[kind].names})
    for kind in ("data", "failures")}


def slices(rows: int, rows_per_file: int) -> list[tuple[int, int]]:
    """(offset, length) of the parts ``rows`` rows are written as: as few parts as hold at
    most ``rows_per_file`` rows each (as finalize cuts them), sizes differing by at most one.
    A large block (a long generate batch, few read blocks) then still lands as parts of
    ~rows_per_file rows, as the setting says, and a retry cuts the same rows the same way."""
    count = max(1, -(-rows // rows_per_file))
    size, extra = divmod(rows, count)
    out, offset = [], 0
    for i in range(count):
        length = size + (1 if i < extra else 0)
        out.append((offset, length))
        offset += length
    return out


class RunSink(Datasink):
    def __init__(self, run_uri: str, storage: StorageConfig, rows_per_file: int):
        self.run_uri, self.storage, self._rows_per_file = run_uri, storage, rows_per_file

    @property
    def min_rows_per_write(self) -> int:
        return self._rows_per_file

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, int]:
        from jobs.io.run_index import row_ids  # imported on the worker
        store = RunStore(self.run_uri, self.storage)
        tables = [BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t for t in tables if t.num_rows]
        for t in tables:
            WRITE_INPUTS.check(t)
        written = {"data": 0, "failures": 0}
        if not tables:
            return written
        table = pa.concat_tables(tables)
        for kind in written:
            part = table.filter(pc.equal(table.column("_kind"), kind))
            KIND_INPUTS[kind].check(part)
            for offset, length in slices(part.num_rows, self._rows_per_file) if part.num_rows else []:
                piece = part.slice(offset, length)
                store.write_part(kind, piece, row_ids(kind, piece))
                written[kind] += length
        return written
