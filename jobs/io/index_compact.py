"""Compacted run index: what ``RunIndex.open`` builds from the sidecars, in one object.

    <run>/index/compact/<n>.arrow      n = 00000001, 00000002, ... (newest = highest)

Written by the session holding the run's lease (jobs/runs/run.py: at the end of every
session, and right after the open when it found many parts no compact object covers),
never by a reader without it. An open then reads the newest usable compact object plus
the sidecars of the parts it does not cover: O(sessions) reads instead of O(parts).

The run index's state (jobs/io/index_state.py) encoded: ``write`` encodes
``RunIndex.state()``, ``load`` decodes an object into an ``IndexState`` that the index
applies itself (``RunIndex.apply``); nothing here sets an index's fields.

One Arrow IPC stream: the per-key arrays (index_state.COLUMNS, in digest order) in
batches of BATCH_ROWS, and in the schema's metadata what else the open derives:
compact_format, key_salt_id, the parts it covers per kind (name, size, sha256), the data
parts in the order the arrays' part ids count them, the finish and settings
vocabularies, failed digests, reject ids, first budgets and the data rows of every
version. Outcome events are not kept: they count rows new to the caller, and a
session's first scan (which the open is) is never counted (jobs/runs/progress.py).

Beside it, ``<n>.stats.arrow``: the report's per-row statistics (part_summary.SERVED)
of every key's latest row at that moment, with its part and row, so the end-of-session
report and ``raygen report`` read one object for the parts object n covers and the
sidecars of newer parts only (run_index.read_latest_stats). It is written before object
n and used only with it (the same data parts, recorded by a digest); a key whose latest
row is not in it (a newer part quarantined since) is read from its part's sidecar.

Used only if it is right for the run as listed now: its format is readable, its salt is
the run's, and every part it covers is still listed with the same size (a part
quarantined or rewritten since: that object is skipped and an older one, or the
sidecars, used). Anything else (unreadable, truncated, unknown format) is skipped with a
warning. The sidecars and parts stay the truth; this is a cache of them.
``RAYGEN_INDEX_COMPACT=0`` neither reads nor writes compact objects (the benchmark's
"before").
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import posixpath
import time
from typing import Any, NamedTuple, Optional

import numpy as np
import pyarrow as pa

from jobs.io import part_summary
from jobs.io.digests import salt_id
from jobs.io.index_state import COLUMNS, IndexState, PartRecord
from jobs.io.run_store import COMPACT
from jobs.io.schema import DATA
from jobs.io.s3_retry import RetryingInputFile
from jobs.io.storage import (Location, delete_file, is_local, list_files, read_bytes,
                             write_local_durably)

logger = logging.getLogger("raygen")
FORMAT = "1"
READABLE_FORMATS = ("1",)
FOLDER = COMPACT
SUFFIX = ".arrow"
STATS_SUFFIX = ".stats.arrow"   # not a number's stem: listed() skips it
STATS_FORMAT = "2"   # 2: with integrity_flags (part_summary format 5)
OLDER_STATS_FORMATS = ("1",)  # not used: the sidecars answer until the next object
# zstd: at 9M keys 374 -> 171 MiB for 0.7 s of writing, read back in 0.1 s; readers
# decompress transparently (the format is unchanged)
_WRITE = pa.ipc.IpcWriteOptions(compression="zstd")
BATCH_ROWS = 1 << 20
KEEP = 2            # compact objects kept: the newest and the one before (a reader may be on it)
TRIES = 3           # newest objects an open tries before it reads the sidecars
OPEN_COMPACT_PARTS = 2000   # uncovered parts at an open worth a compact object at once


class BadCompact(ValueError):
    """A compact object this run cannot use."""


class Loaded(NamedTuple):
    """A usable compact object, decoded: its number, its data parts' digest (what ties
    its stats object to it) and the index state it holds."""

    number: int
    data_digest: str
    state: IndexState


def enabled() -> bool:
    return os.environ.get("RAYGEN_INDEX_COMPACT", "1") not in ("0", "off", "false")


def _stats_loc(store, n: int) -> Location:
    return store.loc(*FOLDER, f"{n:08d}{STATS_SUFFIX}")


def _data_digest(parts: dict[str, list]) -> str:
    """What ties a stats object to its compact object: the data parts both describe."""
    return hashlib.sha256(json.dumps(parts.get("data", [])).encode()).hexdigest()


def _number(path: str) -> Optional[int]:
    stem = posixpath.basename(path).removesuffix(SUFFIX)
    return int(stem) if stem.isdigit() else None


def listed(store) -> list[tuple[int, str]]:
    """(n, path) of the run's compact objects, newest first."""
    found = [(_number(i.path), i.path) for i in list_files(store.loc(*FOLDER), SUFFIX)]
    return sorted(((n, p) for n, p in found if n is not None), reverse=True)


# --- writing --------------------------------------------------------------------------

def _encode(state: IndexState) -> dict[str, Any]:
    """The state's metadata as JSON (the per-key arrays go in the batches)."""
    parts: dict[str, list] = {}
    for path, size, sha256 in state.parts:  # in path order
        kind = posixpath.basename(posixpath.dirname(path))
        parts.setdefault(kind, []).append([posixpath.basename(path), size, sha256])
    return {"parts": parts, "data_parts": [posixpath.basename(p) for p in state.data_parts],
            "finishes": state.finishes, "settings": state.settings,
            "failed": base64.b64encode(state.failed.astype("<u8").tobytes()).decode(),
            "reject_ids": sorted(state.reject_ids),
            "first_budgets": [[h, b, n] for (h, b), n in sorted(state.first_budgets.items(),
                                                                key=str)],
            "data_rows": state.data_rows, "keys": state.keys}


def _decode(meta: dict[str, Any], arrays: dict[str, np.ndarray], store) -> IndexState:
    budgets: dict[tuple, int] = {}
    for h, b, count in meta["first_budgets"]:
        budgets[(h, b)] = budgets.get((h, b), 0) + count
    return IndexState(
        latest=arrays,
        failed=np.frombuffer(base64.b64decode(meta["failed"]), "<u8").astype(np.uint64),
        reject_ids=set(meta["reject_ids"]),
        parts=[PartRecord(store.loc(kind, name).path, size, sha256)
               for kind, parts in meta["parts"].items() for name, size, sha256 in parts],
        data_parts=[store.loc("data", name).path for name in meta["data_parts"]],
        finishes=list(meta["finishes"]), settings=list(meta["settings"]),
        first_budgets=budgets, data_rows=int(meta["data_rows"]))


def write(index, stats: bool = True) -> Optional[str]:
    """Write the index as the run's next compact object (``stats``: and its stats object
    first) and drop all but the newest KEEP; returns its URI (None when switched off).
    Raises OSError on a storage error: the caller logs it (the sidecars still answer
    every open)."""
    if not enabled():
        return None
    store = index.store
    n = (listed(store)[0][0] if listed(store) else 0) + 1
    loc = store.loc(*FOLDER, f"{n:08d}{SUFFIX}")
    state = index.state()
    meta = _encode(state)
    digest = _data_digest(meta["parts"])
    stats_ok = stats and _write_stats(index, n, digest)  # before n
    schema = pa.schema([(name, pa.from_numpy_dtype(dtype)) for name, dtype in COLUMNS.items()],
                       metadata={"compact_format": FORMAT,
                                 "key_salt_id": salt_id(index.key_salt),
                                 "state": json.dumps(meta)})
    with _output(loc) as out, pa.ipc.new_stream(out, schema, options=_WRITE) as writer:
        for start in range(0, state.keys, BATCH_ROWS):  # zero-copy slices of the arrays
            writer.write_batch(pa.record_batch(
                [pa.array(state.latest[name][start:start + BATCH_ROWS]) for name in COLUMNS],
                schema=schema))
    index.note_compact(n if stats_ok else None, digest, len(state.parts))
    for old_n, old in listed(store)[KEEP:]:
        for path in (old, _stats_loc(store, old_n).path):
            try:
                delete_file(store.root.fs, path)
            except FileNotFoundError:
                pass
            except OSError as exc:  # an older object left behind is only bytes
                logger.warning("could not delete old compact index %s: %s", path, exc)
    return loc.uri


def _write_stats(index, n: int, digest: str) -> bool:
    """Object n's stats beside it (False when not written: reports read sidecars)."""
    try:
        tables, names, counts, rows = [], [], [], []
        for path, part_rows, table in index.latest_stats(part_summary.SERVED):
            tables.append(table)
            names.append(posixpath.basename(path))
            counts.append(table.num_rows)
            rows.append(part_rows[:table.num_rows])
        columns = part_summary.SERVED
        if tables:
            table = pa.concat_tables(tables)
        else:
            table = pa.schema([DATA.field(c) for c in columns]).empty_table()
        part = pa.DictionaryArray.from_arrays(
            pa.array(np.repeat(np.arange(len(names), dtype=np.int32), counts), pa.int32()),
            pa.array(names, pa.string()))
        arrays = [part, pa.array(np.concatenate(rows) if rows else [], pa.int32())]
        for name in columns:  # repeated strings stored once
            column = table.column(name).combine_chunks()
            arrays.append(column.dictionary_encode() if pa.types.is_string(column.type)
                          else column)
        out = pa.table(arrays, names=["part", "row", *columns]).replace_schema_metadata({
            "stats_format": STATS_FORMAT, "compact": str(n), "data_parts": digest,
            "key_salt_id": salt_id(index.key_salt)})
        with _output(_stats_loc(index.store, n)) as sink, \
                pa.ipc.new_file(sink, out.schema, options=_WRITE) as writer:
            writer.write_table(out)
        return True
    except (OSError, pa.ArrowException, ValueError) as exc:
        logger.warning("compact index statistics not written (%s: %s): reports read the "
                       "sidecars", type(exc).__name__, exc)
        return False


class CompactStats:
    """A stats object's rows: ``positions(path, rows)`` finds a part's rows in it (None
    when any is not: read that part's sidecar instead), ``columns(positions, names)``
    gives their statistics typed as the part's columns."""

    def __init__(self, table: pa.Table):
        self.table = table
        part = table.column("part").combine_chunks()
        names = part.dictionary.to_pylist()
        codes = part.indices.to_numpy(zero_copy_only=False)
        self.rows = table.column("row").to_numpy()
        cuts = np.flatnonzero(np.diff(codes)) + 1  # written grouped by part, rows ascending
        starts = np.concatenate([[0], cuts]) if len(codes) else np.empty(0, int)
        ends = np.concatenate([cuts, [len(codes)]]) if len(codes) else np.empty(0, int)
        self.ranges = {names[codes[a]]: (int(a), int(b)) for a, b in zip(starts, ends)}

    def positions(self, path: str, rows: np.ndarray) -> Optional[np.ndarray]:
        span = self.ranges.get(posixpath.basename(path))
        if span is None:
            return None
        stored = self.rows[span[0]:span[1]]
        at = np.searchsorted(stored, rows)
        if (at >= len(stored)).any() or (stored[np.minimum(at, len(stored) - 1)] != rows).any():
            return None
        return at + span[0]

    def columns(self, positions: np.ndarray, columns: list[str]) -> pa.Table:
        held = [c for c in columns if c in self.table.column_names]  # older: no setting
        return part_summary.as_part_columns(
            self.table.select(held).take(pa.array(positions)), columns)


def load_stats(index) -> Optional[CompactStats]:
    """The stats of the compact object the index was opened from (None: none usable)."""
    n = getattr(index, "compact_number", None)
    if n is None or not enabled():
        return None
    loc = _stats_loc(index.store, n)
    try:
        data = read_bytes(loc)  # one GET
        if data is None:
            return None  # written by a raygen before it, or not written: the sidecars answer
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        meta = table.schema.metadata or {}
        if meta.get(b"stats_format", b"").decode() in OLDER_STATS_FORMATS:
            logger.info("compact index statistics %s predate integrity_flags: reading the "
                        "sidecars (the session's end writes them anew)", loc.uri)
            return None
        expected = {b"stats_format": STATS_FORMAT, b"compact": str(n),
                    b"data_parts": index.compact_data_digest,
                    b"key_salt_id": salt_id(index.key_salt)}
        wrong = [k.decode() for k, v in expected.items() if meta.get(k, b"").decode() != v]
        if wrong:
            raise BadCompact(f"its {', '.join(wrong)} are not those of compact object {n}")
        return CompactStats(table)
    except (BadCompact, OSError, pa.ArrowException, KeyError, ValueError) as exc:
        logger.warning("compact index statistics %s not used (%s): reading the sidecars",
                       loc.uri, exc)
        return None


class _output:
    """A stream to ``loc`` that appears whole or not at all: local files through a
    temp file renamed into place; S3 objects appear when the upload completes."""

    def __init__(self, loc: Location):
        self.loc = loc

    def __enter__(self):
        if is_local(self.loc):
            self.buffer = pa.BufferOutputStream()  # local: one buffer, then a durable write
            return self.buffer
        self.buffer = None
        self.stream = self.loc.fs.open_output_stream(self.loc.path)
        return self.stream

    def __exit__(self, exc_type, *_):
        if self.buffer is not None:
            if exc_type is None:
                write_local_durably(self.loc.path, self.buffer.getvalue().to_pybytes())
            return False
        self.stream.close()
        if exc_type is not None:  # a half-written object: remove it (readers skip it anyway)
            try:
                self.loc.fs.delete_file(self.loc.path)
            except OSError:
                pass
        return False


# --- reading --------------------------------------------------------------------------

def _check(meta: dict[bytes, bytes], salt: bytes, listing: dict[str, Any],
           store) -> dict[str, Any]:
    fmt = meta.get(b"compact_format", b"").decode()
    if fmt not in READABLE_FORMATS:
        raise BadCompact(f"compact_format {fmt!r} is not one this raygen reads "
                         f"({', '.join(READABLE_FORMATS)})")
    if meta.get(b"key_salt_id", b"").decode() != salt_id(salt):
        raise BadCompact("its key digests use another salt than the run's")
    state = json.loads(meta[b"state"])
    for kind, parts in state["parts"].items():
        for name, size, _ in parts:
            info = listing.get(store.loc(kind, name).path)
            if info is None:
                raise BadCompact(f"covers {kind}/{name}, which is no longer listed "
                                 f"(quarantined or removed since)")
            if info.size != size:
                raise BadCompact(f"covers {kind}/{name} of {size} bytes, listed now with "
                                 f"{info.size} (rewritten since)")
    return state


def _check_namesakes(state: dict[str, Any], store, suspect: frozenset[str]) -> None:
    for kind, parts in state["parts"].items():
        for name, _, sha256 in parts:
            path = store.loc(kind, name).path
            if path in suspect and not store.holds_bytes(path, sha256 or None):
                raise BadCompact(f"covers {kind}/{name}, quarantined since and written again "
                                 f"(same size, other bytes)")


def _read(path: str, store, salt: bytes, listing: dict[str, Any]
          ) -> tuple[dict, dict[str, np.ndarray]]:
    try:
        with RetryingInputFile(store.root.fs, path) as f:
            reader = pa.ipc.open_stream(f)
            state = _check(reader.schema.metadata or {}, salt, listing, store)
            if reader.schema.names != list(COLUMNS):
                raise BadCompact(f"columns {reader.schema.names}, expected {list(COLUMNS)}")
            keys = int(state["keys"])
            arrays = {name: np.empty(keys, dtype) for name, dtype in COLUMNS.items()}
            at = 0
            for batch in reader:  # copied batch by batch: the arrays are the index's own
                if at + batch.num_rows > keys:
                    raise BadCompact(f"holds more than the {keys} keys it declares")
                for i, name in enumerate(COLUMNS):
                    arrays[name][at:at + batch.num_rows] = batch.column(i).to_numpy()
                at += batch.num_rows
    except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError) as exc:
        if isinstance(exc, BadCompact):
            raise
        raise BadCompact(f"unreadable: {type(exc).__name__}: {exc}") from exc
    if at != keys:
        raise BadCompact(f"holds {at} keys, declares {keys} (truncated)")
    return state, arrays


def load(store, salt: bytes, listing: dict[str, Any],
         suspect: frozenset[str] = frozenset()) -> Optional[Loaded]:
    """The newest usable compact object of the run, decoded (None: none usable, the
    sidecars answer). ``salt``: the run's key salt; ``listing``: part path -> FileInfo
    of every part listed now; ``suspect``: paths whose part may have been written again
    under its name since (a quarantined part's): an object covering one is used only if
    its sha256 for it is the part's bytes' now."""
    if not enabled():
        return None
    for n, path in listed(store)[:TRIES]:
        try:
            meta, arrays = _read(path, store, salt, listing)
            _check_namesakes(meta, store, suspect)
        except BadCompact as exc:
            logger.warning("compact index %s not used (%s): reading the sidecars of the "
                           "parts it would cover", store.root.join(
                               *FOLDER, posixpath.basename(path)).uri, exc)
            continue
        return Loaded(n, _data_digest(meta["parts"]), _decode(meta, arrays, store))
    return None


def maybe_write(index, min_uncovered: int = 1, stats: bool = True) -> Optional[str]:
    """Write a compact object when at least ``min_uncovered`` parts the index holds are
    covered by none it has (refreshed first); by the lease holder only. ``stats``
    False: without its stats object (right after an open: they would cost every
    sidecar's read again before the first request; the session's end writes both,
    from the report's own read). A storage error is logged, never raised: the
    sidecars still answer every open."""
    if not enabled() or index.store is None:
        return None
    try:
        index.refresh()
        if len(index.seen) - index.compact_covered < min_uncovered:
            return None
        started = time.monotonic()
        uri = write(index, stats)  # the index notes what it covers now
    except Exception as exc:  # noqa: BLE001 - a cache: never the session's failure
        logger.warning("compact index not written (%s: %s): the next open reads the "
                       "sidecars", type(exc).__name__, exc)
        return None
    logger.info("compact index %s written in %.1f s (%d keys, %d parts)", uri,
                time.monotonic() - started, len(index.done), len(index.seen))
    return uri
