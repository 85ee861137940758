"""Read prompt files as raw lines with their line numbers (stage 1 of the job).

Row contract out: ``source`` (file URI), ``line`` (1-based line in a JSONL file or
row number in a Parquet file), ``raw`` (the line's text / the row as JSON).
Parsing is left to validation so a malformed line becomes a reject naming its line
instead of failing the read. One read task per file, streamed in small blocks, so
memory stays flat however large the file.
"""

from __future__ import annotations

import json
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.parquet as pq
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from jobs.storage import Location

PARQUET_BATCH_ROWS = 1024
READ_CHUNK_BYTES = 1 << 20
RAW_SCHEMA = pa.schema([("source", pa.string()), ("line", pa.int64()), ("raw", pa.string())])


def _is_parquet(loc: Location) -> bool:
    return loc.path.endswith(".parquet")


def iter_jsonl_lines(loc: Location) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line, reading 1 MiB at a time."""
    number, rest = 0, b""
    with loc.fs.open_input_stream(loc.path) as stream:
        while True:
            chunk = stream.read(READ_CHUNK_BYTES)
            if not chunk:
                break
            *lines, rest = (rest + chunk).split(b"\n")
            for raw in lines:
                number += 1
                if raw.strip():
                    yield number, raw.decode("utf-8", errors="replace")
    if rest.strip():
        yield number + 1, rest.decode("utf-8", errors="replace")


def iter_parquet_rows(loc: Location) -> Iterator[tuple[int, str]]:
    number = 0
    with loc.fs.open_input_file(loc.path) as f:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                number += 1
                yield number, json.dumps(row, ensure_ascii=False, default=str)


def iter_rows(loc: Location) -> Iterator[tuple[int, str]]:
    return iter_parquet_rows(loc) if _is_parquet(loc) else iter_jsonl_lines(loc)


def _blocks(loc: Location, limit: Optional[int], block_rows: int) -> Iterator[pa.Table]:
    lines, raws = [], []
    for count, (number, raw) in enumerate(iter_rows(loc), start=1):
        lines.append(number)
        raws.append(raw)
        if len(lines) >= block_rows:
            yield pa.table({"source": [loc.uri] * len(lines), "line": lines, "raw": raws},
                           schema=RAW_SCHEMA)
            lines, raws = [], []
        if limit is not None and count >= limit:
            break
    if lines:
        yield pa.table({"source": [loc.uri] * len(lines), "line": lines, "raw": raws},
                       schema=RAW_SCHEMA)


def count_rows(loc: Location) -> int:
    """Input rows in a file (blank lines excluded), for the progress total."""
    if _is_parquet(loc):
        with loc.fs.open_input_file(loc.path) as f:
            return pq.ParquetFile(f).metadata.num_rows
    return sum(1 for _ in iter_jsonl_lines(loc))


class PromptFiles(Datasource):
    """Ray Data source: one read task per prompt file."""

    def __init__(self, files: list[Location], limit: Optional[int], block_rows: int):
        # Blocks of one generate batch: a generate task then holds one batch, and
        # finished rows reach the writer without waiting for a 1,000-row block.
        self.files, self.limit, self.block_rows = files, limit, block_rows

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                       data_context=None) -> list[ReadTask]:
        tasks = []
        for loc in self.files:
            meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None,
                                 input_files=(loc.uri,))
            tasks.append(ReadTask(lambda loc=loc: _blocks(loc, self.limit, self.block_rows), meta,
                                  schema=RAW_SCHEMA))
        return tasks
