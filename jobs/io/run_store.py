"""A run's prefix on storage, the single source of truth about the run: every file a run
holds is listed here, with the module that writes it; the names below are the ones
those modules use. Formats and their versions: docs/run-layout.md.

    <output>/<run>/run.json                 the run's format and its key-digest salt
                                            (written once, by the first session)
    <output>/<run>/lease.json               who holds the run: one job at a time, renewed
                                            and taken over when stale (local runs: beside
                                            it .lease.json.lock; jobs/io/lease_store.py)
    <output>/<run>/data/part-*.parquet      completions (every version of a row)
    <output>/<run>/failures/part-*.parquet  rows that failed after retries
    <output>/<run>/rejects/part-*.parquet   invalid input rows, with line and reason
    <output>/<run>/index/<kind>/part-*.arrow   each part's sidecar: its keys as digests,
                                            versions, counts; data: the report's per-row
                                            statistics (jobs/io/part_summary.py)
    <output>/<run>/index/compact/<n>.arrow  the run index as one object, written by a
                                            session's lease holder at its end (newest
                                            two kept; jobs/io/index_compact.py)
    <output>/<run>/index/compact/<n>.stats.arrow  beside each: the report's per-row
                                            statistics of every key's latest row then
    <output>/<run>/inputs.json              each input file's fingerprint as the last
                                            admission pass read it: uri, size, rows,
                                            sha256 (jobs/pipeline/input_fingerprints.py)
    <output>/<run>/admission/keys.arrow     what that pass found in the input alone, for
                                            the next session to go on from
                                            (jobs/pipeline/admission_cache.py)
    <output>/<run>/provenance.json          what produced the rows: model files, engine,
                                            argv, sampling, raygen's version, inputs; per
                                            session (jobs/runs/provenance.py)
    <output>/<run>/condemned/<replica>.json the keys a drained replica condemned
                                            (jobs/io/condemned.py)
    <output>/<run>/progress.json            counts derived from the files above
                                            (jobs/runs/progress.py)
    <output>/<run>/context_check.json       --check-context's counts (jobs/runs/context_check.py)
    <output>/<run>/report.{md,json}, report_lengths.png   end-of-run report
                                            (jobs/analysis/report.py)
    <output>/<run>/final/                   one row per prompt + manifest.json (finalize)
    <output>/<run>/quarantine/<kind>/       damaged parts moved aside, each with a
                                            <part>.reason.json saying why

Files are immutable and atomically written; names are hashes of their row keys, so a
retried write replaces itself instead of duplicating rows. Every reader goes through
the run index (jobs/io/run_index.py), which reads the newest compact object and the
small sidecars of the parts it does not cover instead of the parts; the parts stay the
truth: a sidecar missing (a crash between part and sidecar), unreadable or stale is
rebuilt from its part, a sidecar without its part is ignored, and a compact object
covering a part that is gone or changed size is not used.

A part that cannot be read (garbage, truncated, wrong schema, a page whose checksum
fails, bytes whose sha256 is not its sidecar's) must not brick the run: ``read_part``
moves it to quarantine/ with the reason and reads it as no rows, so every reader
(resume, progress, report, finalize, export) goes on and the next run regenerates
those rows. Storage errors (network, permissions) are not damage and propagate: only a
part whose bytes were read and found bad is moved.
"""

from __future__ import annotations

import hashlib
import io
import logging
import posixpath
import time
from typing import Iterable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.config import StorageConfig
from jobs.io import part_summary
from jobs.io.digests import new_salt
from jobs.io.schema import KINDS, LATER_COLUMNS
from jobs.io.s3_retry import RetryingInputFile, retried
from jobs.io.storage import (Location, is_local, list_files, locate, put_verified, read_json,
                             read_whole, write_bytes_atomic, write_json_atomic)

logger = logging.getLogger("raygen")
# Names of a run's files and folders (the layout above), for the modules that own them.
RUN_FILE = "run.json"
LEASE_FILE = "lease.json"                    # jobs/io/lease_store.py
INPUTS_FILE = "inputs.json"                  # jobs/pipeline/input_fingerprints.py
ADMISSION_KEYS = ("admission", "keys.arrow")  # jobs/pipeline/admission_cache.py
PROVENANCE_FILE = "provenance.json"          # jobs/runs/provenance.py
CONDEMNED = "condemned"                      # jobs/io/condemned.py
COMPACT = (part_summary.INDEX, "compact")    # jobs/io/index_compact.py
QUARANTINE = "quarantine"
# 3: run.json exists, key digests salted per run. A run without run.json (made before it)
# is format 2: unsalted digests; its first session under this version records that.
RUN_FORMAT = 3
READABLE_RUN_FORMATS = (2, 3)
WRITE_ATTEMPTS = 3
# What pyarrow raises for bytes that are not a readable Parquet file of our schema.
_DAMAGE = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


class DamagedPart(ValueError):
    """A part's bytes are not a readable part of its kind."""


class UnknownRunFormat(ValueError):
    """<run>/run.json is of a format this raygen cannot read (a newer one, or damaged)."""


def part_name(row_ids: Iterable[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(row_ids)).encode()).hexdigest()[:24]
    return f"part-{digest}.parquet"


class RunStore:
    def __init__(self, run_uri: str, storage: StorageConfig):
        self.storage = storage
        self.root: Location = locate(run_uri, storage)
        # Canonical URI: workers run elsewhere, so never a relative local path.
        self.uri = run_uri if run_uri.startswith("s3://") else self.root.path
        self._run_file: Optional[dict] = None

    @classmethod
    def for_run(cls, output: str, run_name: str, storage: StorageConfig) -> "RunStore":
        return cls(output.rstrip("/") + "/" + run_name, storage)

    def loc(self, *parts: str) -> Location:
        return self.root.join(*parts)

    # --- the run's format (run.json) ---

    def run_file(self) -> dict:
        """<run>/run.json as read once by this process ({} while it does not exist)."""
        if self._run_file is None:
            found = self.read_json(RUN_FILE)
            if found is not None:
                fmt = found.get("run_format") if isinstance(found, dict) else None
                if fmt not in READABLE_RUN_FORMATS:
                    raise UnknownRunFormat(
                        f"{self.loc(RUN_FILE).uri} has run_format {fmt!r}; this raygen reads "
                        f"{', '.join(map(str, READABLE_RUN_FORMATS))} (a newer raygen made "
                        f"this run: use that version)")
            self._run_file = found or {}
        return self._run_file

    @property
    def key_salt(self) -> bytes:
        """The salt of the run's key digests (jobs/io/digests.py); b"" for a run made
        before salts, or one without run.json yet (then it holds no digests either)."""
        return bytes.fromhex(self.run_file().get("key_salt", ""))

    def init_run_file(self) -> dict:
        """Write <run>/run.json if it is missing (by the session holding the lease,
        before anything else is written): a new run gets a random salt; a run that
        already holds parts (made before run.json) is recorded as format 2, unsalted,
        so its digests and sidecars stay valid."""
        if self.run_file():
            return self._run_file
        held = any(list_files(self.loc(kind), ".parquet") for kind in KINDS)
        record = ({"run_format": 2, "key_salt": ""} if held else
                  {"run_format": RUN_FORMAT, "key_salt": new_salt().hex()})
        write_json_atomic(self.loc(RUN_FILE), record)
        self._run_file = record
        return record

    def write_part(self, kind: str, table: pa.Table, row_ids: Iterable[str]) -> str:
        """Write one immutable part file and read it back, then its sidecar; returns its
        name. The rows count as done only once the stored part's footer and row count
        check out: a damaged upload is rewritten (same name), and after WRITE_ATTEMPTS
        it raises."""
        table = table.select(KINDS[kind].names).cast(KINDS[kind])
        buf = io.BytesIO()
        # Page checksums: every reader then verifies each page it decodes.
        pq.write_table(table, buf, compression="zstd", write_page_checksum=True)
        data = buf.getvalue()
        sha256 = hashlib.sha256(data).hexdigest()
        name = part_name(row_ids)
        loc = self.loc(kind, name)
        problem = ""
        for _ in range(WRITE_ATTEMPTS):
            put_verified(loc, data, self.storage)
            problem = self.verify_part(loc.path, kind, table.num_rows)
            if not problem:
                self.write_sidecar(kind, name, table, len(data), sha256)
                return name
            logger.warning("part %s read back damaged (%s): rewriting it", loc.uri, problem)
        raise DamagedPart(f"part {loc.uri} still damaged after {WRITE_ATTEMPTS} writes: "
                          f"{problem}")

    def verify_part(self, path: str, kind: str, rows: int) -> str:
        """"" if the stored part reads back whole with ``rows`` rows, else the problem."""
        try:
            got = self.load_part(path, kind, ["key"] if kind != "rejects" else ["line"])
        except FileNotFoundError:  # a reader quarantined a damaged first upload meanwhile
            return "not found"
        except (DamagedPart, *_DAMAGE) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "" if got.num_rows == rows else f"{got.num_rows} rows stored, {rows} written"

    def sidecar_loc(self, kind: str, part_name: str) -> Location:
        return self.loc(part_summary.INDEX, kind, part_summary.sidecar_name(part_name))

    def write_sidecar(self, kind: str, name: str, table: pa.Table, part_bytes: int,
                      part_sha256: Optional[str] = None) -> None:
        """The part's sidecar; a failed write only costs a rebuild from the part later."""
        summary = part_summary.summarize(kind, table, part_bytes, part_sha256, self.key_salt)
        try:
            write_bytes_atomic(self.sidecar_loc(kind, name), part_summary.encode(summary))
        except OSError as exc:
            logger.warning("sidecar of %s/%s not written (%s): the run index rebuilds it "
                           "from the part", kind, name, exc)

    def part_paths(self, kind: str) -> list[str]:
        return [info.path for info in list_files(self.loc(kind), ".parquet")]

    def read_part(self, path: str, columns: Optional[list[str]] = None,
                  sha256: Optional[str] = None) -> pa.Table:
        """The part's rows (``columns`` of its kind's schema); a damaged part is moved
        to quarantine/ and reads as no rows. ``sha256``: what its sidecar recorded; the
        whole part is then read and its bytes checked against it."""
        kind = posixpath.basename(posixpath.dirname(path))
        try:
            return self.load_part(path, kind, columns, sha256)
        except FileNotFoundError:  # another reader quarantined it a moment ago
            return _empty(kind, columns)
        except (DamagedPart, *_DAMAGE) as exc:
            self.quarantine(path, f"{type(exc).__name__}: {exc}")
            return _empty(kind, columns)

    def part_bytes(self, path: str) -> bytes:
        """The part's bytes (storage errors raise: they are not damage)."""
        return retried(read_whole, self.root.fs, path, what=f"read of {path}")

    def holds_bytes(self, path: str, sha256: Optional[str]) -> bool:
        """The part's bytes now have this sha256 (a part that is gone holds any: its
        reader finds it gone)."""
        try:
            data = self.part_bytes(path)
        except FileNotFoundError:
            return True
        return sha256 == hashlib.sha256(data).hexdigest()

    def load_part(self, path: str, kind: str, columns: Optional[list[str]] = None,
                  sha256: Optional[str] = None) -> pa.Table:
        """Read and check one part; raises DamagedPart (or pyarrow's error) if bad.

        Bytes read whole (with ``sha256``, or after a streaming read failed) are checked
        and decoded in memory, so a storage error (raised by the read) is never taken
        for damage, and a decode error of bytes that did arrive (zstd, a page checksum)
        always is."""
        if sha256 is not None:
            data = self.part_bytes(path)
            got = hashlib.sha256(data).hexdigest()
            if got != sha256:
                raise DamagedPart(f"its bytes changed since it was written (sha256 {got[:16]}, "
                                  f"its sidecar says {sha256[:16]}; same size: bit rot, or a "
                                  f"write that never reached the disk)")
            return self._decode_bytes(data, kind, columns)
        try:
            # Every read retried: a throttled small ranged read (the footer, one column
            # chunk) otherwise ends in the SDK's non-retryable INTERNAL_FAILURE.
            with RetryingInputFile(self.root.fs, path) as f:
                return self._decode(f, kind, columns)
        except FileNotFoundError:
            raise
        except OSError:  # the storage, or a decode error in what it sent: read it whole
            return self._decode_bytes(self.part_bytes(path), kind, columns)

    def _decode_bytes(self, data: bytes, kind: str, columns: Optional[list[str]]) -> pa.Table:
        try:
            return self._decode(pa.BufferReader(data), kind, columns)
        except (DamagedPart, *_DAMAGE):
            raise
        except Exception as exc:  # noqa: BLE001 - bytes in hand: any decode error is damage
            raise DamagedPart(f"cannot decode: {type(exc).__name__}: {exc}") from exc

    def _decode(self, f, kind: str, columns: Optional[list[str]]) -> pa.Table:
        schema = KINDS.get(kind)
        pf = pq.ParquetFile(f, page_checksum_verification=True)
        wanted = columns or (schema.names if schema else pf.schema_arrow.names)
        missing = [c for c in wanted if c not in pf.schema_arrow.names]
        if set(missing) - LATER_COLUMNS:
            raise DamagedPart(f"wrong schema: no column(s) {', '.join(missing)}")
        table = pf.read(columns=[c for c in wanted if c not in missing])
        if table.num_rows != pf.metadata.num_rows:
            raise DamagedPart(f"read {table.num_rows} rows, footer says "
                              f"{pf.metadata.num_rows}")
        if schema is None:
            return table
        for c in missing:  # written before the column existed: nulls, in schema order
            table = table.append_column(schema.field(c), pa.nulls(table.num_rows,
                                                                  schema.field(c).type))
        table = table.select(wanted)
        try:
            return table.cast(pa.schema([schema.field(c) for c in wanted]))
        except _DAMAGE as exc:
            raise DamagedPart(f"wrong schema: {exc}") from exc

    def quarantine(self, path: str, reason: str) -> None:
        """Move a damaged part to quarantine/<kind>/ beside a .reason.json."""
        kind, name = posixpath.split(posixpath.relpath(path, self.root.path))
        dest = self.loc(QUARANTINE, kind, name)
        logger.warning("quarantining damaged part %s (%s): its rows count as not done "
                       "and are regenerated by the next run", path, reason)
        if is_local(dest):
            dest.fs.create_dir(posixpath.dirname(dest.path), recursive=True)
        try:
            retried(self.root.fs.move, path, dest.path,  # S3: copy + delete
                    what=f"quarantine of {path}")
        except FileNotFoundError:
            return  # another reader moved it first
        write_json_atomic(self.loc(QUARANTINE, kind, name + ".reason.json"),
                          {"part": f"{kind}/{name}", "reason": reason,
                           "quarantined_at": time.time()})

    def quarantined(self) -> list[str]:
        """Quarantined parts, as <kind>/<name>, sorted: one listing of the quarantine
        folder, not one a kind (every progress tick asks)."""
        root = self.loc(QUARANTINE).path
        names = [posixpath.relpath(info.path, root)
                 for info in list_files(self.loc(QUARANTINE), ".parquet", recursive=True)]
        return [n for n in names if posixpath.dirname(n) in KINDS]

    def read_kind(self, kind: str, columns: Optional[list[str]] = None) -> pa.Table:
        tables = [self.read_part(p, columns) for p in self.part_paths(kind)]
        return pa.concat_tables(tables) if tables else _empty(kind, columns)

    def read_json(self, name: str):
        return read_json(self.loc(name))


def _empty(kind: str, columns: Optional[list[str]]) -> pa.Table:
    schema = KINDS[kind]
    return schema.empty_table() if columns is None else pa.schema(
        [schema.field(c) for c in columns]).empty_table()
