"""`raygen export --incremental`: export what is new since the last call, while the run
goes on. The folder's journal (export_journal.py: append-only batch manifests, the
per-key watermark, the supersede rule, the lock) says what earlier calls exported.

Design decisions:
- A running run is not refused (that is the point): every call reads the run index as
  it is now and exports the keys whose latest row is newer than the journal saw; a row
  still being written is not in the index yet and comes with a later call.
- Only durable, verified rows: data parts are whole objects (atomic writes), and each
  part read is checked against the sha256 its sidecar recorded and its page checksums,
  as the full export does; a part found damaged is quarantined, nothing of the call is
  committed, and the next call goes on without it. Flagged rows are dropped by default.
- Only the parts holding rows to export are read: a call costs what was written since
  the last one (plus the run index's sidecars).
- Filters run on each key's latest row, as in a full export; a key that had a record
  and whose newer row a filter drops is withdrawn (in `supersedes`), so the journal
  read with its rule equals a full export at the same moment.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from jobs.analysis import export_journal as journal_io
from jobs.analysis.export_shards import (MANIFEST, ExportError, ExportPass, Filters, ShardWriter,
                                         output_location, read_columns, with_samples)
from jobs.analysis.finalize import damage_note, pick_latest
from jobs.analysis.template_check import PRETOKENIZED, TemplateCheck
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.io.storage import read_bytes

POS = "__export_pos"  # a row's position in the index's per-key arrays, through the filters


def rows_to_export(index: RunIndex, journal: journal_io.Journal
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the index's per-key arrays of the latest rows newer than the
    journal saw, the batch holding each one's live record or -1)."""
    latest = index.latest
    newer, prev = journal.newer(latest["digest"], latest["version"], latest["created_ms"])
    return np.flatnonzero(newer), prev[newer]


def options_of(store: RunStore, fmt: str, file_type: str, filters: Filters,
               extras: tuple[str, ...]) -> dict[str, Any]:
    return {"run": store.uri, "format": fmt, "file_type": file_type,
            "filters": filters.as_json(),
            "extra_columns": list(extras)}


def export_incremental(store: RunStore, out_uri: str, fmt: str, filters: Filters = Filters(),
                       file_type: str = "jsonl", rows_per_file: int = 10_000,
                       extras: tuple[str, ...] = (), template: Optional[TemplateCheck] = None,
                       trainer_max_length: Optional[int] = None) -> Optional[dict[str, Any]]:
    """Export one batch: the rows new since the journal's last one. Returns its
    manifest, or None when there was nothing new (nothing is written then)."""
    if template is not None and fmt == "pretokenized":
        raise ExportError(PRETOKENIZED)
    out = output_location(store, out_uri)
    if read_bytes(out.join(MANIFEST)) is not None:
        raise ExportError(f"{out.uri} holds a full export ({MANIFEST}): an incremental "
                          f"export keeps its own journal; give it another --out")
    lock = journal_io.ExportLock(out, store.storage)
    lock.acquire()
    try:
        journal = journal_io.read_journal(out)
        options = options_of(store, fmt, file_type, filters, extras)
        journal_io.check_options(journal, options)
        journal_io.remove(out, [p.rsplit("/", 1)[-1] for p in journal.orphans])
        return _batch(store, out, journal, lock, options, rows_per_file, template,
                      trainer_max_length)
    finally:
        lock.release()


def _batch(store: RunStore, out, journal: journal_io.Journal, lock: journal_io.ExportLock,
           options: dict[str, Any], rows_per_file: int, template: Optional[TemplateCheck],
           trainer_max_length: Optional[int]) -> Optional[dict[str, Any]]:
    started = time.monotonic()
    picks = pick_latest(store)
    if not picks.keys:
        raise ExportError(f"run {store.uri} has no rows in data/ yet: nothing to export")
    index = picks.index
    if with_samples(store, index, ()):  # its supersede rule names records by id alone
        raise ExportError(f"run {store.uri} has several samples per prompt: --incremental "
                          f"does not export such runs yet; export it whole (without "
                          f"--incremental) once it has ended")
    journal_io.check_digests(journal, index.done)
    positions, prev = rows_to_export(index, journal)
    if not len(positions):
        return None
    n, fmt, extras = journal.next_batch, options["format"], tuple(options["extra_columns"])
    columns, yields = read_columns(fmt, extras, trainer_max_length)
    writer = ShardWriter(out, fmt, options["file_type"], rows_per_file, extras,
                         journal_io.shard_prefix(n, lock.token))
    filters = Filters.of_json(options["filters"])
    rows_pass = ExportPass(writer, fmt, filters, extras, template, yields)
    prev_of = np.full(len(index.latest["digest"]), -1, np.int32)
    prev_of[positions] = prev
    written = np.zeros(len(index.latest["digest"]), bool)
    supersedes: dict[int, list[str]] = {}
    damaged: dict[str, int] = {}
    for path, group in index.by_part(positions):
        lock.renew()
        table = store.read_part(path, columns, index.checksums.get(path))
        if not table.num_rows:  # found damaged by this read: quarantined
            damaged[path] = len(group)
            continue
        table = table.take(pa.array(index.latest["row"][group]))
        table = table.append_column(POS, pa.array(group, pa.int64()))
        written[rows_pass.add(table)[POS].to_numpy()] = True
        for key, b in zip(table["key"].to_pylist(), prev_of[group].tolist()):
            if b >= 0:  # its record in batch b is no longer its latest
                supersedes.setdefault(b, []).append(key)
    writer.cut()
    own = [f["name"] for f in writer.files]
    if damaged:
        journal_io.remove(out, own)
        raise ExportError(f"run {store.uri}: {damage_note(damaged)}; nothing of this batch "
                          f"was committed: export again (the run regenerates those rows)")
    if template is not None and template.refused():
        journal_io.remove(out, own)
        raise ExportError(template.refusal())
    keys = journal_io.write_keys(out, journal_io.keys_name(n, lock.token), journal_io.encode_keys(
        index.latest["digest"][positions], index.latest["version"][positions],
        index.latest["created_ms"][positions], written[positions]))
    manifest = _manifest(store, out, journal, n, options, writer, keys, supersedes, picks,
                         rows_pass, int(written.sum()), positions, started)
    lock.renew(force=True)  # the lock is ours right up to the commit
    journal_io.commit(out, store.storage, manifest, own + [keys["name"]])
    return manifest


def _manifest(store: RunStore, out, journal: journal_io.Journal, n: int,
              options: dict[str, Any], writer: ShardWriter, keys: dict[str, Any],
              supersedes: dict[int, list[str]], picks, rows_pass: ExportPass, rows: int,
              positions: np.ndarray, started: float) -> dict[str, Any]:
    index = picks.index
    replaced = sum(len(v) for v in supersedes.values())
    elapsed = time.monotonic() - started
    return {
        "journal_format": journal_io.JOURNAL_FORMAT, "batch": n, "out": out.uri,
        "options": options, "format": options["format"],
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rows": rows, "files": writer.files, "keys_file": keys,
        "keys_looked_at": len(positions), "digest_probes": [  # export_journal.check_digests
            str(d) for d in index.latest["digest"][positions[:journal_io.PROBES]]],
        "supersedes": {str(b): sorted(k) for b, k in sorted(supersedes.items())},
        "superseded": replaced,
        "live_keys": journal.live + rows - replaced,  # records a trainer reads, all batches
        "watermark": {  # the run as this call's index saw it
            "data_parts": len(index.part_paths), "data_rows": picks.data_rows,
            "keys": picks.keys, "newest_part_at": dt.datetime.fromtimestamp(
                index.last_write_ts, dt.timezone.utc).isoformat(timespec="seconds"),
            "parts_sha256": hashlib.sha256("\n".join(sorted(
                index.part_paths)).encode()).hexdigest()},
        **rows_pass.fields(store),
        "elapsed_s": round(elapsed, 3), "rows_per_s": round(rows / max(elapsed, 1e-9), 1),
    }


def render(m: Optional[dict[str, Any]], out_uri: str) -> str:
    if m is None:
        return (f"nothing new to export to {out_uri}: every key's latest row is already "
                f"in a batch (or dropped by a filter); nothing written")
    dropped = ", ".join(f"{k} {v:,}" for k, v in m["dropped"].items() if v) or "none"
    wm = m["watermark"]
    return "\n".join([
        f"exported batch {m['batch']}: {m['rows']:,} rows ({m['format']}, "
        f"{m['options']['file_type']}) to {m['out']} in {len(m['files'])} file(s), "
        f"{m['elapsed_s']:.1f} s",
        f"  read:       {m['keys_looked_at']:,} keys new or newer since the last batch "
        f"(run: {wm['keys']:,} keys, {wm['data_rows']:,} data rows in {wm['data_parts']:,} "
        f"parts, newest {wm['newest_part_at']})",
        f"  dropped:    {dropped}",
        f"  supersedes: {m['superseded']:,} records of earlier batches "
        f"(a newer version, here or dropped by a filter)",
        f"  live:       {m['live_keys']:,} keys across batches 0..{m['batch']}",
        f"  manifest:   {m['out']}/{journal_io.batch_name(m['batch'])}",
    ])
