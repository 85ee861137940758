"""A run's prefix on storage, the single source of truth about the run.

    <output>/<run>/data/part-*.parquet      completions (every version of a row)
    <output>/<run>/failures/part-*.parquet  rows that failed after retries
    <output>/<run>/rejects/part-*.parquet   invalid input rows, with line and reason
    <output>/<run>/progress.json            counts derived from the files above
    <output>/<run>/report.{md,json,png}     end-of-run report
    <output>/<run>/final/                   one row per prompt + manifest (finalize)

Files are immutable and atomically written; names are hashes of their row keys, so a
retried write replaces itself instead of duplicating rows. Readers never trust any
other index: resume, progress and reports all read these files.
"""

from __future__ import annotations

import hashlib
import io
from typing import Iterable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.config import StorageConfig
from jobs.schema import KINDS
from jobs.storage import Location, list_files, locate, read_bytes, write_bytes_atomic


def part_name(row_ids: Iterable[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(row_ids)).encode()).hexdigest()[:24]
    return f"part-{digest}.parquet"


class RunStore:
    def __init__(self, run_uri: str, storage: StorageConfig):
        self.storage = storage
        self.root: Location = locate(run_uri, storage)
        # Canonical URI: workers run elsewhere, so never a relative local path.
        self.uri = run_uri if run_uri.startswith("s3://") else self.root.path

    @classmethod
    def for_run(cls, output: str, run_name: str, storage: StorageConfig) -> "RunStore":
        return cls(output.rstrip("/") + "/" + run_name, storage)

    def loc(self, *parts: str) -> Location:
        return self.root.join(*parts)

    def write_part(self, kind: str, table: pa.Table, row_ids: Iterable[str]) -> str:
        """Write one immutable part file; returns its name."""
        table = table.select(KINDS[kind].names).cast(KINDS[kind])
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        name = part_name(row_ids)
        write_bytes_atomic(self.loc(kind, name), buf.getvalue())
        return name

    def part_paths(self, kind: str) -> list[str]:
        return [info.path for info in list_files(self.loc(kind), ".parquet")]

    def read_part(self, path: str, columns: Optional[list[str]] = None) -> pa.Table:
        with self.root.fs.open_input_file(path) as f:
            return pq.read_table(f, columns=columns)

    def read_kind(self, kind: str, columns: Optional[list[str]] = None) -> pa.Table:
        tables = [self.read_part(p, columns) for p in self.part_paths(kind)]
        if not tables:
            schema = KINDS[kind]
            return schema.empty_table() if columns is None else pa.schema(
                [schema.field(c) for c in columns]).empty_table()
        return pa.concat_tables(tables)

    def read_json(self, name: str):
        data = read_bytes(self.loc(name))
        import json
        return None if data is None else json.loads(data)
