"""Finalize a run: exactly one row per prompt, with a manifest that marks completion.

    python -m jobs.analysis.finalize <run> [--config FILE] [--force] [--allow-partial]
                            [--rows-per-file N]

writes <run>/final/part-00000.parquet ... and <run>/final/manifest.json.

Design decisions:
- data/ keeps every version of a row (continuations append version+1); consumers
  want one row per key. The winner is the latest version (ties, which the writer never
  produces, break by created_at, then file path and row position, so the choice is
  still deterministic).
- Two passes keep memory bounded on a 900K-row run: pass 1 reads a few scalar columns
  to pick winners; pass 2 streams the data files in path order, keeps the winning rows
  and cuts parts of at most rows_per_file rows (or ~1 GiB of Arrow data).
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
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.io.run_store import RunStore
from jobs.io.schema import DATA
from jobs.io.storage import list_files, write_bytes_atomic, write_json_atomic

ROWS_PER_FILE = 50_000
MAX_BUFFER_BYTES = 1 << 30   # cut a part early rather than hold more Arrow data than this
PICK_COLUMNS = ["key", "version", "created_at", "finish_reason", "max_new_tokens",
                "settings_hash"]


class FinalizeError(RuntimeError):
    """The run cannot be finalized now; the message says why and what to do."""


@dataclass
class Picks:
    paths: list[str]                  # data files, sorted by path
    rows: dict[int, np.ndarray]       # file index -> winning row positions, ascending
    winners: pd.DataFrame             # PICK_COLUMNS of the winning rows
    data_rows: int                    # rows of every version read


def pick_latest(store: RunStore) -> Picks:
    """Pass 1: the latest version of every key, from a few scalar columns."""
    paths = store.part_paths("data")
    frames = []
    for i, path in enumerate(paths):
        df = store.read_part(path, PICK_COLUMNS).to_pandas()
        frames.append(df.assign(_file=i, _row=np.arange(len(df))))
    if not frames:
        return Picks(paths, {}, pd.DataFrame(columns=PICK_COLUMNS), 0)
    rows = pd.concat(frames, ignore_index=True)
    rows = rows.sort_values(["key", "version", "created_at", "_file", "_row"], kind="stable")
    winners = rows.drop_duplicates("key", keep="last")
    picks = {int(f): np.sort(g["_row"].to_numpy())
             for f, g in winners.groupby("_file", sort=True)}
    return Picks(paths, picks, winners, len(rows))


def _write_part(store: RunStore, index: int, table: pa.Table) -> dict[str, Any]:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    data = buf.getvalue()
    name = f"part-{index:05d}.parquet"
    write_bytes_atomic(store.loc("final", name), data)
    return {"name": name, "rows": table.num_rows, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def write_parts(store: RunStore, picks: Picks, rows_per_file: int) -> list[dict[str, Any]]:
    """Pass 2: stream the winning rows into final/part-NNNNN.parquet; the file entries."""
    files: list[dict[str, Any]] = []
    buffer: list[pa.Table] = []   # concatenated only when a part is cut: no re-copying

    def cut(final: bool) -> list[pa.Table]:
        table = pa.concat_tables(buffer) if buffer else DATA.empty_table()
        while table.num_rows and (table.num_rows >= rows_per_file or final
                                  or table.nbytes > MAX_BUFFER_BYTES):
            n = min(rows_per_file, table.num_rows)
            files.append(_write_part(store, len(files), table.slice(0, n)))
            table = table.slice(n)
        return [table] if table.num_rows else []

    for i, path in enumerate(picks.paths):
        if i not in picks.rows:
            continue
        buffer.append(store.read_part(path).select(DATA.names).cast(DATA).take(picks.rows[i]))
        if (sum(t.num_rows for t in buffer) >= rows_per_file
                or sum(t.nbytes for t in buffer) > MAX_BUFFER_BYTES):
            buffer = cut(final=False)
    cut(final=True)
    return files


def _counts(series: pd.Series) -> dict[str, int]:
    return {str(k): int(v) for k, v in sorted(Counter(series.astype(str)).items())}


def missing_parts(store: RunStore, winners: pd.DataFrame) -> dict[str, Any]:
    """What keeps the run from being complete ({} when nothing does)."""
    progress = store.read_json("progress.json") or {}
    failed = set(store.read_kind("failures", ["key"]).column("key").to_pylist())
    missing = {"status": progress.get("status", "unknown"),
               "prompts_without_result": int(progress.get("remaining") or 0),
               "open_failures": len(failed - set(winners["key"]))}
    if (missing["status"] == "succeeded" and not missing["prompts_without_result"]
            and not missing["open_failures"]):
        return {}
    return missing


def build_manifest(store: RunStore, picks: Picks, files: list[dict[str, Any]],
                   rows_per_file: int, missing: dict[str, Any]) -> dict[str, Any]:
    winners = picks.winners
    failed = set(store.read_kind("failures", ["key"]).column("key").to_pylist())
    return {
        "run": store.uri, "complete": not missing, "missing": missing or None,
        "schema": "jobs.io.schema.DATA",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "row_count": int(sum(f["rows"] for f in files)), "rows_per_file": rows_per_file,
        "files": files,
        "source_data_files": len(picks.paths), "source_data_rows": picks.data_rows,
        "settings_hashes": _counts(winners["settings_hash"]),
        "budgets": _counts(winners["max_new_tokens"]),
        "finish_reasons": _counts(winners["finish_reason"]),
        "versions": _counts(winners["version"]),
        "open_failures": len(failed - set(winners["key"])),
    }


def _remove_stale(store: RunStore, keep: set[str]) -> None:
    for info in list_files(store.loc("final"), ".parquet"):
        if posixpath.basename(info.path) not in keep:
            store.root.fs.delete_file(info.path)


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
    if picks.winners.empty:
        raise FinalizeError(f"run {store.uri} has no rows in data/: nothing to finalize")
    missing = missing_parts(store, picks.winners)
    if missing and not allow_partial:
        raise FinalizeError(
            f"run {store.uri} is not complete (last status {missing['status']}, "
            f"{missing['prompts_without_result']} prompts without a result, "
            f"{missing['open_failures']} open failures): rerun the job to finish it "
            f"(--retry-failed redoes failures), or pass --allow-partial to finalize what "
            f"there is with complete=false and what is missing in the manifest")
    manifest_loc = store.loc("final", "manifest.json")
    try:  # from here until the new manifest lands, final/ reads as incomplete
        store.root.fs.delete_file(manifest_loc.path)
    except FileNotFoundError:
        pass
    files = write_parts(store, picks, rows_per_file)
    _remove_stale(store, {f["name"] for f in files})
    manifest = build_manifest(store, picks, files, rows_per_file, missing)
    write_json_atomic(manifest_loc, manifest)
    return manifest


def main(argv: Optional[list[str]] = None) -> int:
    from jobs.analysis.run_cli import add_run_args, fail, open_run, require_run
    parser = argparse.ArgumentParser(prog="python -m jobs.analysis.finalize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    parser.add_argument("--force", action="store_true",
                        help="finalize even though progress.json says the run is running")
    parser.add_argument("--allow-partial", action="store_true",
                        help="finalize a run that is not complete (stopped, failed, open "
                             "failures): manifest complete=false with what is missing")
    parser.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE,
                        help=f"rows per final part file (default {ROWS_PER_FILE})")
    args = parser.parse_args(argv)
    if args.rows_per_file < 1:
        fail("--rows-per-file must be >= 1")
    store = open_run(args.run, args.config)
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
