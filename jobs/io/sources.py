"""Read prompt files as raw lines with their line numbers (stage 1 of the job).

Row contract out: ``source`` (file URI), ``line`` (1-based line in a JSONL file or
row number in a Parquet file), ``ordinal`` (the row's place in input order: file index
in ``job.input``, then line; see ``ordinal_of``), ``raw`` (the line's text / the row
as JSON), ``problem`` (why the line cannot be read as it is, else null).
Parsing is left to validation so a malformed line becomes a reject naming its line
instead of failing the read. One read task per file, streamed in small blocks, so
memory stays flat however large the file.

Any bytes are a row: ``problem`` (None for a readable line) says why a line cannot be
passed on as it is, and validation rejects it with that reason: bytes that are not
UTF-8 (``raw`` then shows them as backslash escapes) or a line longer than ``max_line_bytes``
(``raw`` then holds its start; the rest is skipped without being kept). A file without
newlines is read in one linear pass, never re-split.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from jobs.io.storage import Location, open_retrying

PARQUET_BATCH_ROWS = 1024
READ_CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 16 << 20   # job.max_line_bytes' default
PREVIEW_BYTES = 2000        # what an over-long line keeps (rejects/ keeps as much)
RAW_SCHEMA = pa.schema([("source", pa.string()), ("line", pa.int64()),
                        ("ordinal", pa.int64()), ("raw", pa.string()),
                        ("problem", pa.string())])
ORDINAL_SHIFT = 40  # lines per file < 2**40; files < 2**23


def ordinal_of(file_index: int, line: int) -> int:
    """One int64 that sorts rows in input order: job.input file order, then line."""
    return (file_index << ORDINAL_SHIFT) | line


def place_of_ordinal(files: list[str], ordinal: int) -> str:
    return f"{files[ordinal >> ORDINAL_SHIFT]}:{ordinal & ((1 << ORDINAL_SHIFT) - 1)}"


def _is_parquet(loc: Location) -> bool:
    return loc.path.endswith(".parquet")


def _line(data: bytes, size: int, max_line_bytes: int) -> tuple[str, Optional[str]]:
    """(text, problem) of one line's bytes (``size``: its full length)."""
    if size > max_line_bytes:
        text = data[:PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")
        return text, (f"the line has {size:,} bytes, more than job.max_line_bytes "
                      f"({max_line_bytes:,}): split the prompt or raise the limit")
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return data.decode("utf-8", errors="backslashreplace"), (
            f"not valid UTF-8: byte 0x{data[exc.start]:02x} at byte {exc.start} of the line "
            f"(re-export the file as UTF-8)")


def iter_jsonl_lines(loc: Location, hasher: Any = None, max_line_bytes: int = MAX_LINE_BYTES,
                     skip_lines: int = 0) -> Iterator[tuple[int, str, Optional[str]]]:
    """(line number, text, problem) of every non-blank line, reading 1 MiB at a time.

    ``hasher`` (a hashlib object) is fed every byte read: the file's content hash
    comes from the same pass. A line keeps at most ``max_line_bytes + 1`` of its bytes
    in memory; the newline search only looks at each chunk once. The first
    ``skip_lines`` lines are read (and hashed) but neither kept nor decoded."""
    number, pending, size = 0, [], 0  # the unfinished line: kept pieces, full length
    keep = max_line_bytes + 1
    with open_retrying(loc) as stream:  # each 1 MiB read retried on a throttled S3
        while True:
            chunk = stream.read(READ_CHUNK_BYTES)
            if not chunk:
                break
            if hasher is not None:
                hasher.update(chunk)
            start = 0
            if number < skip_lines:  # lines this chunk ends, all skipped: counted at C speed
                newlines = chunk.count(b"\n")
                if number + newlines < skip_lines:  # the line it starts is skipped too
                    number += newlines
                    pending, size = [], 0
                    continue
            while True:
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                if size < keep:
                    pending.append(piece[:keep - size])
                size += len(piece)
                if end < 0:
                    break
                number += 1
                data = b"".join(pending)
                if number > skip_lines and (size > max_line_bytes or data.strip()):
                    yield (number, *_line(data, size, max_line_bytes))
                pending, size, start = [], 0, end + 1
    data = b"".join(pending)
    if number + 1 > skip_lines and (size > max_line_bytes or data.strip()):
        yield (number + 1, *_line(data, size, max_line_bytes))


def iter_parquet_rows(loc: Location, hasher: Any = None, max_line_bytes: int = MAX_LINE_BYTES
                      ) -> Iterator[tuple[int, str, Optional[str]]]:
    """(row number, row as JSON, problem); ``hasher`` is fed each row's JSON."""
    number = 0
    with open_retrying(loc) as f:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                number += 1
                raw = json.dumps(row, ensure_ascii=False, default=str)
                data = raw.encode()
                if hasher is not None:
                    hasher.update(data + b"\n")
                if len(data) > max_line_bytes:
                    yield (number, *_line(data, len(data), max_line_bytes))
                else:
                    yield number, raw, None


def iter_rows(loc: Location, hasher: Any = None, max_line_bytes: int = MAX_LINE_BYTES,
              skip_lines: int = 0) -> Iterator[tuple[int, str, Optional[str]]]:
    """``skip_lines`` (JSONL only): lines read and hashed, not parsed (a grown input's
    old lines, jobs/pipeline/admission_cache.py)."""
    if _is_parquet(loc):
        assert not skip_lines, "a Parquet input is read whole"
        return iter_parquet_rows(loc, hasher, max_line_bytes)
    return iter_jsonl_lines(loc, hasher, max_line_bytes, skip_lines)


def _table(loc: Location, file_index: int, lines: list[int], raws: list[str],
           problems: list[Optional[str]]) -> pa.Table:
    return pa.table({"source": [loc.uri] * len(lines), "line": lines,
                     "ordinal": [ordinal_of(file_index, n) for n in lines], "raw": raws,
                     "problem": problems}, schema=RAW_SCHEMA)


def _blocks(loc: Location, file_index: int, limit: Optional[int], block_rows: int,
            only_lines: Optional[np.ndarray] = None,
            max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[pa.Table]:
    """``only_lines``: sorted line numbers to keep (the rest are skipped unparsed)."""
    lines, raws, problems = [], [], []
    wanted = iter(only_lines.tolist()) if only_lines is not None else None
    next_wanted = next(wanted, None) if wanted is not None else None
    for count, (number, raw, problem) in enumerate(iter_rows(loc, None, max_line_bytes),
                                                   start=1):
        if wanted is not None:
            while next_wanted is not None and next_wanted < number:
                next_wanted = next(wanted, None)
            if next_wanted != number:
                if next_wanted is None:
                    break  # nothing wanted further down this file
                continue
        lines.append(number)
        raws.append(raw)
        problems.append(problem)
        if len(lines) >= block_rows:
            yield _table(loc, file_index, lines, raws, problems)
            lines, raws, problems = [], [], []
        if limit is not None and count >= limit:
            break
    if lines:
        yield _table(loc, file_index, lines, raws, problems)


def count_rows(loc: Location, max_line_bytes: int = MAX_LINE_BYTES) -> int:
    """Input rows in a file (blank lines excluded), for the progress total."""
    if _is_parquet(loc):
        with open_retrying(loc) as f:
            return pq.ParquetFile(f).metadata.num_rows
    return sum(1 for _ in iter_jsonl_lines(loc, None, max_line_bytes))


def lines_of_file(ordinals: np.ndarray, file_index: int) -> np.ndarray:
    """The line numbers of one file among sorted ordinals (ordinal_of), sorted."""
    lo = np.searchsorted(ordinals, ordinal_of(file_index, 0))
    hi = np.searchsorted(ordinals, ordinal_of(file_index + 1, 0))
    return ordinals[lo:hi] & ((1 << ORDINAL_SHIFT) - 1)


class PromptFiles(Datasource):
    """Ray Data source: one read task per prompt file.

    ``only``: ``[ObjectRef]`` of the sorted ordinals the admission pass chose; lines not
    among them are skipped before parsing (a resume of a large run reads its input
    without validating the rows it already holds). The admit stage still checks every
    row it gets, so this only saves work."""

    def __init__(self, files: list[Location], limit: Optional[int], block_rows: int,
                 only: Optional[list] = None, max_line_bytes: int = MAX_LINE_BYTES):
        # Blocks of one generate batch: a generate task then holds one batch, and
        # finished rows reach the writer without waiting for a 1,000-row block.
        self.files, self.limit, self.block_rows, self.only = files, limit, block_rows, only
        self.max_line_bytes = max_line_bytes

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                       data_context=None) -> list[ReadTask]:
        tasks = []
        for index, loc in enumerate(self.files):
            meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None,
                                 input_files=(loc.uri,))
            tasks.append(ReadTask(lambda loc=loc, index=index: _blocks(
                loc, index, self.limit, self.block_rows, self._lines(index),
                self.max_line_bytes), meta, schema=RAW_SCHEMA))
        return tasks

    def _lines(self, file_index: int) -> Optional[np.ndarray]:
        if self.only is None:
            return None
        import ray
        return lines_of_file(ray.get(self.only[0]), file_index)
