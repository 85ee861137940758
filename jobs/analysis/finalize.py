"""Finalize a run: exactly one row per prompt, with a manifest that marks completion.

    python -m jobs.analysis.finalize <run> [--config FILE] [--force] [--allow-partial]
                            [--rows-per-file N]

writes <run>/final/part-00000.parquet ... and <run>/final/manifest.json.

Design decisions:
- data/ keeps every version of a row (continuations append version+1); consumers
  want one row per key. The winner is the latest version by the run index's one rule
  (jobs/io/run_index.py: ties, which the writer never produces, break by created_at,
  then file path and row position, so the choice is still deterministic).
- Memory stays bounded on a 900K-row run: the run index picks the winners from the
  parts' sidecars (no part read for that); then the data files are streamed in path
  order, the winning rows kept and cut into parts of at most rows_per_file rows (or
  ~1 GiB of Arrow data); the manifest's counts are tallied on the way.
- Idempotent and crash-safe: the old manifest is deleted first, parts get
  deterministic names and contents (same input -> same bytes -> same sha256), parts
  that are no longer part of the result are removed, and the manifest is written last.
  A final/ without manifest.json is incomplete; readers use the manifest's file list.
- A run whose progress.json says "running" is refused unless --force: finalizing
  while the driver still writes would miss rows and mislead.
- ``complete: true`` means every prompt of the run has its row: the last job
  succeeded, no prompt is without a result and no failure is open. Anything else is
  refused unless --allow-partial, which writes ``complete: false`` and a ``missing``
  entry (status, prompts without a result, open failures) so no reader mistakes a
  partial dataset for the whole one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import posixpath
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.analysis.run_cli import add_run_args, fail, open_args, require_run
from jobs.io.run_index import RunIndex, read_latest
from jobs.io.run_store import PROVENANCE_FILE, RunStore
from jobs.io.schema import DATA
from jobs.io.storage import delete_file, list_files, write_bytes_atomic, write_json_atomic

ROWS_PER_FILE = 50_000
MAX_BUFFER_BYTES = 1 << 30   # cut a part early rather than hold more Arrow data than this
# Manifest field -> the column of the winning rows it counts.
TALLIED = {"settings_hashes": "settings_hash", "budgets": "max_new_tokens",
           "finish_reasons": "finish_reason", "versions": "version"}


class FinalizeError(RuntimeError):
    """The run cannot be finalized now; the message says why and what to do."""


@dataclass
class Picks:
    index: RunIndex                   # which row of which part is each key's latest
    keys: int                         # one winner per key
    data_rows: int                    # rows of every version
    data_files: int
    open_failures: int                # keys failed and not done since


def pick_latest(store: RunStore) -> Picks:
    """The latest version of every key, from the run index (the parts' sidecars)."""
    index = RunIndex.open(store)
    return Picks(index, len(index.done), index.data_rows, len(index.part_paths),
                 len(index.open_failed()))


def damage_note(damaged: dict[str, int]) -> str:
    return (f"{sum(damaged.values())} rows of {len(damaged)} data part(s) were found damaged "
            f"and moved to quarantine/ ({', '.join(sorted(damaged))}); the next run of the "
            f"job regenerates them")


def _write_part(store: RunStore, index: int, table: pa.Table) -> dict[str, Any]:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    data = buf.getvalue()
    name = f"part-{index:05d}.parquet"
    write_bytes_atomic(store.loc("final", name), data)
    return {"name": name, "rows": table.num_rows, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


@dataclass
class Written:
    files: list[dict[str, Any]] = field(default_factory=list)
    tallies: dict[str, Counter] = field(default_factory=lambda: {k: Counter() for k in TALLIED})
    damaged: dict[str, int] = field(default_factory=dict)  # part -> winners it lost


def write_parts(store: RunStore, picks: Picks, rows_per_file: int) -> Written:
    """Stream the winning rows into final/part-NNNNN.parquet: the file entries and the
    tallies of the rows written."""
    out = Written()
    buffer: list[pa.Table] = []   # concatenated only when a part is cut: no re-copying

    def cut(final: bool) -> list[pa.Table]:
        table = pa.concat_tables(buffer) if buffer else DATA.empty_table()
        while table.num_rows and (table.num_rows >= rows_per_file or final
                                  or table.nbytes > MAX_BUFFER_BYTES):
            n = min(rows_per_file, table.num_rows)
            out.files.append(_write_part(store, len(out.files), table.slice(0, n)))
            table = table.slice(n)
        return [table] if table.num_rows else []

    # Every part read whole and checked against its sidecar's sha256: a part damaged
    # without changing its size is found here, not trusted.
    for path, part, expected in read_latest(store, picks.index, verify=True):
        if part.num_rows < expected:
            out.damaged[path] = expected - part.num_rows
        if not part.num_rows:
            continue
        winners = part.select(DATA.names).cast(DATA)
        for name, column in TALLIED.items():
            out.tallies[name].update(str(v) for v in winners.column(column).to_pylist())
        buffer.append(winners)
        if (sum(t.num_rows for t in buffer) >= rows_per_file
                or sum(t.nbytes for t in buffer) > MAX_BUFFER_BYTES):
            buffer = cut(final=False)
    cut(final=True)
    return out


def missing_parts(store: RunStore, picks: Picks,
                  damaged: Optional[dict[str, int]] = None) -> dict[str, Any]:
    """What keeps the run from being complete ({} when nothing does)."""
    progress = store.read_json("progress.json") or {}
    missing = {"status": progress.get("status", "unknown"),
               "prompts_without_result": int(progress.get("remaining") or 0),
               "open_failures": picks.open_failures}
    if damaged:
        missing["damaged_parts"] = dict(sorted(damaged.items()))
    if (missing["status"] == "succeeded" and not missing["prompts_without_result"]
            and not missing["open_failures"] and not damaged):
        return {}
    return missing


def build_manifest(store: RunStore, picks: Picks, written: Written,
                   rows_per_file: int, missing: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": store.uri, "complete": not missing, "missing": missing or None,
        "schema": "jobs.io.schema.DATA",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "row_count": int(sum(f["rows"] for f in written.files)),
        "rows_per_file": rows_per_file, "files": written.files,
        "source_data_files": picks.data_files, "source_data_rows": picks.data_rows,
        **{name: dict(sorted(counts.items())) for name, counts in written.tallies.items()},
        "open_failures": picks.open_failures,
        "provenance": store.read_json(PROVENANCE_FILE),  # jobs/runs/provenance.py
    }


def _remove_stale(store: RunStore, keep: set[str]) -> None:
    for info in list_files(store.loc("final"), ".parquet"):
        if posixpath.basename(info.path) not in keep:
            delete_file(store.root.fs, info.path)


def check_not_running(store: RunStore, force: bool) -> None:
    progress = store.read_json("progress.json") or {}
    if progress.get("status") == "running" and not force:
        raise FinalizeError(
            f"run {store.uri} is still running (progress.json status=running): finalizing "
            f"now would miss rows still being written. Wait for it to finish (or, if its "
            f"driver was killed, rerun the job to complete it); --force finalizes anyway.")


def finalize(store: RunStore, force: bool = False, rows_per_file: int = ROWS_PER_FILE,
             allow_partial: bool = False) -> dict[str, Any]:
    """Write final/ (parts, then manifest.json last); returns the manifest."""
    check_not_running(store, force)
    picks = pick_latest(store)
    if not picks.keys:
        raise FinalizeError(f"run {store.uri} has no rows in data/: nothing to finalize")
    missing = missing_parts(store, picks)
    if missing and not allow_partial:
        raise FinalizeError(
            f"run {store.uri} is not complete (last status {missing['status']}, "
            f"{missing['prompts_without_result']} prompts without a result, "
            f"{missing['open_failures']} open failures): rerun the job to finish it "
            f"(--retry-failed redoes failures), or pass --allow-partial to finalize what "
            f"there is with complete=false and what is missing in the manifest")
    manifest_loc = store.loc("final", "manifest.json")
    try:  # from here until the new manifest lands, final/ reads as incomplete
        delete_file(store.root.fs, manifest_loc.path)
    except FileNotFoundError:
        pass
    written = write_parts(store, picks, rows_per_file)
    if written.damaged:
        if not allow_partial:  # final/ keeps no manifest: it reads as incomplete
            raise FinalizeError(f"run {store.uri}: {damage_note(written.damaged)}. Rerun the "
                                f"job, then finalize (or --allow-partial: complete=false)")
        missing = missing_parts(store, picks, written.damaged)
    _remove_stale(store, {f["name"] for f in written.files})
    manifest = build_manifest(store, picks, written, rows_per_file, missing)
    write_json_atomic(manifest_loc, manifest)
    return manifest


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m jobs.analysis.finalize` and `raygen finalize`."""
    add_run_args(parser)
    parser.add_argument("--force", action="store_true",
                        help="finalize even though progress.json says the run is running")
    parser.add_argument("--allow-partial", action="store_true",
                        help="finalize a run that is not complete (stopped, failed, open "
                             "failures): manifest complete=false with what is missing")
    parser.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE, metavar="N",
                        help=f"rows per final part file (default {ROWS_PER_FILE})")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.analysis.finalize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.rows_per_file < 1:
        fail("--rows-per-file must be >= 1")
    store = open_args(args)
    require_run(store)
    try:
        manifest = finalize(store, force=args.force, rows_per_file=args.rows_per_file,
                            allow_partial=args.allow_partial)
    except FinalizeError as exc:
        fail(str(exc))
    print(f"finalized {store.uri}: {manifest['row_count']:,} rows (one per key) in "
          f"{len(manifest['files'])} file(s) from {manifest['source_data_rows']:,} data rows; "
          f"finish {manifest['finish_reasons']}; manifest {store.loc('final', 'manifest.json').uri}"
          + ("" if manifest["complete"] else f"; PARTIAL, missing {manifest['missing']}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
