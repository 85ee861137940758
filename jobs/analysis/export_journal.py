"""The journal of an incremental export (`raygen export --incremental`): what each call
exported, so the next call exports only what is new and a trainer can read the shards
while the run goes on.

    OUT/batch-00000.manifest              one per call that exported anything (JSON)
    OUT/batch-00000-<token>.keys          the rows that call looked at (Arrow IPC)
    OUT/part-b00000-<token>-00000.jsonl   its shards (or .parquet)
    OUT/export.lock                       while a call runs

Design decisions:
- Append-only: a batch manifest is created once, by a conditional create (S3
  If-None-Match, a local link(2)), and never rewritten; batch n is committed only after
  0..n-1. Its create is the commit point: shards and keys file first, the manifest
  last. A call that dies before it leaves files no manifest names; the next call (under
  the lock) removes them. Format ``JOURNAL_FORMAT`` in every manifest; an unknown one
  is refused, never guessed at.
- The watermark is per key: a batch's keys file holds, for each key it looked at, the
  digest, version and created_at of the row it saw and whether it wrote it (else a
  filter dropped it). The next call takes from the run index the keys whose latest row
  is newer by the index's own rule (run_index.later on LATEST_ORDER's version, then
  created_at; the journal keeps no part path): new keys, continued rows, rows
  regenerated after a quarantine. A manifest's ``watermark`` says
  how much of the run the call saw (parts, rows, keys, newest part).
- The supersede rule: a batch's ``supersedes`` maps an earlier batch to the keys whose
  record there is no longer the key's latest (the new version is in this batch, or a
  filter dropped it: the key then has no record). Reading every batch's shards and
  skipping a record (batch b, id k) that a later batch's supersedes[b] lists gives each
  key once, at its latest version: what a full export at the last call would hold.
- One writer at a time: ``ExportLock`` is export.lock, held with the run lease's
  conditional writes (jobs/io/lease_store.py) and renewed as the call goes; another
  call refuses while it is fresh and takes it over once unrenewed for LOCK_STALE_S.
  Shard and keys names carry the call's token and the manifest create is conditional,
  so even two calls that both believed they held the lock never mix files or both
  commit a batch.
- Damage is an error, not guessed around: a manifest that does not parse, a gap in the
  numbering, a keys file or shard missing or not the size/sha256 recorded.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import posixpath
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from jobs.io.digests import sorted_contains
from jobs.io.run_index import later
from jobs.io.lease_store import LeaseConflict, conditional_object
from jobs.io.storage import (AlreadyExists, Location, create_exclusive, delete_file, list_files,
                             read_bytes, write_bytes_atomic)

JOURNAL_FORMAT = 1
LOCK = "export.lock"
LOCK_RENEW_S = 30.0     # renewed at most this often while a call runs
LOCK_STALE_S = 600.0    # unrenewed this long (the store's clock): its call is gone
BATCH_MANIFEST = re.compile(r"^batch-(\d{5})\.manifest$")
OWN_FILE = re.compile(r"^(part-b\d{5}-[0-9a-f]+-\d{5}\.(jsonl|parquet)"
                      r"|batch-\d{5}-[0-9a-f]+\.keys)$")  # a batch's files, by their names
KEYS_SCHEMA = pa.schema([("digest", pa.uint64()), ("version", pa.int32()),
                         ("created_ms", pa.int64()), ("written", pa.bool_())])
# The options every batch of one export shares: a later call with others would mix
# record shapes or filters in one dataset.
FIXED_OPTIONS = ("run", "format", "file_type", "filters", "extra_columns")


class JournalError(RuntimeError):
    """The export folder's journal cannot be used as it is; the message says why."""


def batch_name(n: int) -> str:
    return f"batch-{n:05d}.manifest"


def keys_name(n: int, token: str) -> str:
    return f"batch-{n:05d}-{token}.keys"


def shard_prefix(n: int, token: str) -> str:
    return f"part-b{n:05d}-{token}-"


# --- reading the journal -------------------------------------------------------------

@dataclass
class Journal:
    out: Location
    batches: list[dict[str, Any]] = field(default_factory=list)   # manifests, in order
    # Per key looked at, sorted by digest: the row seen, and the batch holding its live
    # record (-1: dropped by a filter, no record).
    digest: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    version: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    created_ms: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    batch: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    orphans: list[str] = field(default_factory=list)  # paths no manifest names

    @property
    def next_batch(self) -> int:
        return len(self.batches)

    @property
    def live(self) -> int:
        """Keys with a record a trainer reads (after the supersede rule)."""
        return int((self.batch >= 0).sum())

    def newer(self, digest: np.ndarray, version: np.ndarray,
              created_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of the rows newer than what the journal saw of their key, the batch
        holding each one's live record or -1)."""
        if not len(self.digest):
            return np.ones(len(digest), bool), np.full(len(digest), -1, np.int32)
        found, pos = sorted_contains(self.digest, digest)
        seen_v = np.where(found, self.version[pos], -1)
        seen_c = np.where(found, self.created_ms[pos], 0)
        newer = later((version, created_ms), (seen_v, seen_c))  # the index's rule
        return newer, np.where(found, self.batch[pos], -1)


def has_journal(out: Location) -> bool:
    return any(BATCH_MANIFEST.match(posixpath.basename(i.path)) for i in list_files(out))


def read_journal(out: Location) -> Journal:
    """Every committed batch, checked: numbering, format, keys files, shards."""
    files = {posixpath.basename(i.path): i for i in list_files(out)}
    numbers = sorted(int(m.group(1)) for m in map(BATCH_MANIFEST.match, files) if m)
    if numbers != list(range(len(numbers))):
        missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
        raise JournalError(f"export {out.uri} is damaged: {batch_name(missing[0])} is "
                           f"missing (batches {numbers[0]}..{numbers[-1]} found); export "
                           f"to a new --out (a full export rebuilds everything)")
    journal, tables, named = Journal(out), [], set()
    for n in numbers:
        manifest = _load_manifest(out, n, files)
        journal.batches.append(manifest)
        named.update(f["name"] for f in manifest["files"])
        named.add(manifest["keys_file"]["name"])
        tables.append(_load_keys(out, n, manifest, files))
    journal.orphans = [files[name].path for name in files
                       if OWN_FILE.match(name) and name not in named]
    if tables:
        _fold(journal, tables)
    return journal


def _load_manifest(out: Location, n: int, files: dict) -> dict[str, Any]:
    name = batch_name(n)
    try:
        manifest = json.loads(read_bytes(out.join(name)) or b"")
        fmt, files_listed = manifest["journal_format"], manifest["files"]
        if not isinstance(manifest["keys_file"]["name"], str) or not isinstance(
                manifest["supersedes"], dict):
            raise TypeError("keys_file.name or supersedes of the wrong type")
    except (ValueError, KeyError, TypeError) as exc:
        raise JournalError(f"export {out.uri} is damaged: {name} is not a batch manifest "
                           f"({type(exc).__name__}: {exc}); export to a new --out") from None
    if fmt != JOURNAL_FORMAT:
        raise JournalError(f"{out.uri}/{name} has journal_format {fmt!r}; this raygen "
                           f"reads {JOURNAL_FORMAT}: use the raygen that wrote it")
    for entry in files_listed:
        info = files.get(entry["name"])
        if info is None or info.size != entry["bytes"]:
            found = "missing" if info is None else f"{info.size} bytes, recorded {entry['bytes']}"
            raise JournalError(f"export {out.uri} is damaged: shard {entry['name']} of "
                               f"batch {n} is {found}; export to a new --out")
    return manifest


def _load_keys(out: Location, n: int, manifest: dict, files: dict) -> pa.Table:
    entry = manifest["keys_file"]
    data = read_bytes(out.join(entry["name"])) if entry["name"] in files else None
    if data is None or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        problem = "missing" if data is None else "not the sha256 its manifest recorded"
        raise JournalError(f"export {out.uri} is damaged: {entry['name']} (the keys of "
                           f"batch {n}) is {problem}; export to a new --out")
    table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    return table.append_column("batch", pa.array(
        np.where(table["written"].to_numpy(zero_copy_only=False), n, -1), pa.int32()))


def _fold(journal: Journal, tables: list[pa.Table]) -> None:
    """Each key's last entry (batches in order: a later one saw a newer row)."""
    t = pa.concat_tables(tables)
    digest = t["digest"].to_numpy()
    order = np.lexsort((np.arange(len(digest)), digest))
    digest = digest[order]
    last = np.ones(len(digest), bool)
    last[:-1] = digest[1:] != digest[:-1]
    pick = order[last]
    journal.digest = digest[last]
    journal.version = t["version"].to_numpy()[pick]
    journal.created_ms = t["created_ms"].to_numpy()[pick]
    journal.batch = t["batch"].to_numpy()[pick]


def check_options(journal: Journal, options: dict[str, Any]) -> None:
    """A later call must export as the first did (one record shape, one filter set)."""
    if not journal.batches:
        return
    first = journal.batches[0]["options"]
    for name in FIXED_OPTIONS:
        if first.get(name) != options.get(name):
            raise JournalError(
                f"export {journal.out.uri} was started with {name} = "
                f"{json.dumps(first.get(name), sort_keys=True)}; this call has "
                f"{json.dumps(options.get(name), sort_keys=True)}. An incremental export "
                f"keeps its options: rerun with the same ones, or export to another --out")


PROBES = 8  # key digests a batch records, to tell the run's digests from other ones


def check_digests(journal: Journal, done: np.ndarray) -> None:
    """The journal's digests must be the run index's: if none of the last batch's probe
    digests is among the run's keys, the run's key digests changed (another salt) and
    every key would look new and be exported twice."""
    probes = journal.batches[-1].get("digest_probes") if journal.batches else None
    if probes and not sorted_contains(done, np.array([int(p) for p in probes],
                                                     np.uint64))[0].any():
        raise JournalError(
            f"export {journal.out.uri}: none of the keys batch {journal.next_batch - 1} "
            f"recorded is in the run now (the run's key digests changed, or its data/ was "
            f"replaced): export to a new --out")


# --- writing a batch -----------------------------------------------------------------

def encode_keys(digest: np.ndarray, version: np.ndarray, created_ms: np.ndarray,
                written: np.ndarray) -> bytes:
    table = pa.table([pa.array(digest, pa.uint64()), pa.array(version, pa.int32()),
                      pa.array(created_ms, pa.int64()), pa.array(written, pa.bool_())],
                     schema=KEYS_SCHEMA)
    buf = io.BytesIO()
    with pa.ipc.new_file(buf, KEYS_SCHEMA) as writer:
        writer.write_table(table)
    return buf.getvalue()


def write_keys(out: Location, name: str, data: bytes) -> dict[str, Any]:
    write_bytes_atomic(out.join(name), data)
    return {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def commit(out: Location, storage, manifest: dict[str, Any], own_files: list[str]) -> None:
    """Create the batch's manifest, only if no call committed that batch first; if one
    did, remove this call's files (``own_files``: names in ``out``) and say so."""
    data = (json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n").encode()
    try:
        create_exclusive(out.join(batch_name(manifest["batch"])), data, storage)
    except AlreadyExists:
        remove(out, own_files)
        raise JournalError(f"another export committed batch {manifest['batch']} of "
                           f"{out.uri} first (its lock was taken over while this call "
                           f"ran): nothing of this call was kept; run it again") from None


def remove(out: Location, names: list[str]) -> None:
    for name in names:
        try:
            delete_file(out.fs, out.join(name).path)
        except FileNotFoundError:
            pass


def superseded(batches: list[dict[str, Any]]) -> dict[int, set[str]]:
    """batch -> the ids of its records that later batches supersede: the trainer's skip
    list (the rule in the module docstring)."""
    skip: dict[int, set[str]] = {}
    for manifest in batches:
        for b, keys in manifest["supersedes"].items():
            skip.setdefault(int(b), set()).update(keys)
    return skip


# --- the lock ------------------------------------------------------------------------

class ExportLock:
    """export.lock: one incremental export of a folder at a time."""

    def __init__(self, out: Location, storage):
        self.out, self.obj = out, conditional_object(out.join(LOCK), storage)
        self.token = uuid.uuid4().hex[:12]
        self.version: Optional[str] = None
        self.renewed = 0.0

    def _body(self) -> dict[str, Any]:
        return {"job_id": f"export-{os.getpid()}", "host": socket.gethostname(),
                "pid": os.getpid(), "renewed_at": time.time(), "token": self.token,
                "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}

    def acquire(self) -> None:
        try:
            self.version = self.obj.create(self._body())
        except LeaseConflict:
            current = self.obj.read()
            if current is None:  # released meanwhile
                return self.acquire()
            holder, version = current
            age = self.obj.age_s
            if age is None or age < LOCK_STALE_S:
                raise JournalError(
                    f"another incremental export to {self.out.uri} is running: "
                    f"{holder.get('job_id')} on {holder.get('host')} (pid "
                    f"{holder.get('pid')}) since {holder.get('since')}, lock renewed "
                    f"{'?' if age is None else f'{age:.0f}'} s ago. Wait for it to end; "
                    f"a lock unrenewed for {LOCK_STALE_S:.0f} s is taken over") from None
            try:  # its call is gone: take it over, only if nobody else did first
                self.version = self.obj.replace(self._body(), version)
            except LeaseConflict:
                raise JournalError(f"another export took over the stale lock of "
                                   f"{self.out.uri} first; run again later") from None
        self.renewed = time.monotonic()

    def renew(self, force: bool = False) -> None:
        """Renew if LOCK_RENEW_S passed (or ``force``); a lost lock raises."""
        if not force and time.monotonic() - self.renewed < LOCK_RENEW_S:
            return
        try:
            self.version = self.obj.replace(self._body(), self.version)
        except LeaseConflict:
            raise JournalError(f"the lock of {self.out.uri} was taken over while this "
                               f"export ran (unrenewed for {LOCK_STALE_S:.0f} s): "
                               f"nothing of this call was kept; run it again") from None
        self.renewed = time.monotonic()

    def release(self) -> None:
        if self.version is not None:
            self.obj.delete(self.version)
            self.version = None
