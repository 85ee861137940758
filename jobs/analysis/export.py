"""Export a run as training data for a drafter, in the trainers' own formats.

    python -m jobs.analysis.export RUN --format pretokenized|conversations|messages --out URI
        [--file-type jsonl|parquet] [--include-truncated] [--require-finished-thinking]
        [--max-repetition-ratio R] [--max-length N] [--category C ...] [--setting S ...]
        [--config FILE] [--extra-columns accept_length,category,setting]
        [--check-template TOKENIZER [--max-template-mismatch SHARE] [--allow-template-mismatch]]
        [--incremental]

writes URI/part-00000.jsonl ... and URI/export.manifest (JSON: what was written, what
each filter dropped). Formats, one record per kept row:

- pretokenized: {"id", "input_ids": prompt ids + output ids, "loss_mask": 0 per prompt
  token, 1 per output token}; the ids the model sampled, nothing added (a truncated row
  ends where the budget cut it). speculators' prepare_data and SpecForge's prompt
  files pass such rows through without re-tokenizing. A row of job.regenerate
  every_turn also has 1 over each earlier assistant turn in its prompt (the model's own,
  as its template renders them: jobs/pipeline/turns.py loss_mask, spans from the replica).
- conversations: {"id", "conversations": [prompt turns..., {"role": "assistant",
  "content": answer, "reasoning_content": reasoning}], "tools"}: SpecForge's and
  speculators' chat files. An every_turn row: the source through its last regenerated
  turn, every assistant turn the model's (turns.conversation).
- messages: the same turns under "messages" (HF/TRL chat datasets).
"tools" is the tools' JSON text, "[]" when none: both trainers parse it, and a column
that is never null keeps one type in every shard (datasets.load_dataset("json") takes
the types from the first shard and fails on a later string where it saw only nulls).

--extra-columns appends the rows' accept_length / category / setting to every record
(extra_columns.py); --check-template re-renders conversations/messages records as the
trainers do and refuses an export whose ids differ from the sampled ones
(template_check.py). --incremental exports only what is new since the last such call,
also while the run goes on (incremental_export.py; its journal: export_journal.py).

Design decisions:
- Streaming: finalize.pick_latest picks each key's latest version from the run index
  (the parts' sidecars); then data files are read one at a time, only the winning rows and the
  columns the format needs, filtered, converted and appended to the current shard.
  Memory is one data file plus one shard (cut at --rows-per-file or ~256 MiB).
- Filters run on the latest version (a continued row counts as its continuation), in a
  fixed order; the manifest counts what each dropped.
- Output like finalize: the old manifest is deleted first, shards get deterministic
  names, stale part-NNNNN files of an earlier export are removed, the manifest comes
  last. Its name has no data extension: speculators reads every *.json/*.jsonl under a
  folder and HF datasets every data file, so only the shards may look like data.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from typing import Any, Optional

from jobs.analysis import (export_journal, extra_columns, incremental_export, template_check,
                           token_yield)
from jobs.analysis.export_shards import (FILE_TYPES, FORMATS, MANIFEST, PARQUET_SCHEMAS,
                                         ROWS_PER_FILE, ExportError, ExportPass, Filters,
                                         ShardWriter, chat_turns, conversations_record,
                                         messages_record, output_location,
                                         pretokenized_lines, pretokenized_record,
                                         read_columns, row_flags, with_samples,
                                         _remove_stale)
from jobs.analysis.finalize import FinalizeError, check_not_running, damage_note, pick_latest
from jobs.analysis.run_cli import add_run_args, fail, open_args, require_run
from jobs.analysis.template_check import TemplateCheck, TemplateCheckError, render_lines
from jobs.io.run_index import read_latest
from jobs.io.run_store import RunStore
from jobs.io.storage import delete_file, write_json_atomic

# export's own and, from export_shards.py, what a caller of an export needs
__all__ = ["export", "render", "add_args", "filters_from_args", "run", "main", "FORMATS",
           "FILE_TYPES", "ROWS_PER_FILE", "MANIFEST", "PARQUET_SCHEMAS", "ExportError",
           "Filters", "chat_turns", "conversations_record", "messages_record",
           "pretokenized_lines", "pretokenized_record", "row_flags"]


def export(store: RunStore, out_uri: str, fmt: str, filters: Filters = Filters(),
           file_type: str = "jsonl", rows_per_file: int = ROWS_PER_FILE,
           force: bool = False, extras: tuple[str, ...] = (),
           template: Optional[TemplateCheck] = None,
           trainer_max_length: Optional[int] = None) -> dict[str, Any]:
    """Write the shards, then the manifest; returns the manifest. `extras`: the
    --extra-columns added to each record; `template`: the --check-template round trip,
    which refuses the export (no shards, no manifest) over its limit."""
    if template is not None and fmt == "pretokenized":
        raise ExportError(template_check.PRETOKENIZED)
    started = time.monotonic()
    out = output_location(store, out_uri)
    if export_journal.has_journal(out):
        raise ExportError(f"{out.uri} holds an incremental export (batch-*.manifest): "
                          f"continue it with --incremental, or export to another --out")
    try:
        check_not_running(store, force)
    except FinalizeError:
        raise ExportError(f"run {store.uri} is still running (progress.json status=running): "
                          f"an export now would miss rows still being written. Wait for it "
                          f"to finish; --force exports what is there.") from None
    picks = pick_latest(store)
    if not picks.keys:
        raise ExportError(f"run {store.uri} has no rows in data/: nothing to export")
    try:  # until the new manifest lands, the folder reads as incomplete
        delete_file(out.fs, out.join(MANIFEST).path)
    except FileNotFoundError:
        pass
    extras = with_samples(store, picks.index, extras)  # one record per (key, sample)
    columns, yields = read_columns(fmt, extras, trainer_max_length)
    writer, damaged = ShardWriter(out, fmt, file_type, rows_per_file, extras), {}
    rows_pass = ExportPass(writer, fmt, filters, extras, template, yields)
    for path, part, expected in read_latest(store, picks.index, columns, verify=True):
        if part.num_rows < expected:  # damaged: quarantined by the read
            damaged[path] = expected - part.num_rows
        if part.num_rows:
            rows_pass.add(part)
    writer.cut()
    if damaged:  # no manifest: the folder reads as incomplete
        raise ExportError(f"run {store.uri}: {damage_note(damaged)}. Rerun the job, then "
                          f"export again")
    if template is not None and template.refused():  # no shards, no manifest
        _remove_stale(out, set())
        raise ExportError(template.refusal())
    _remove_stale(out, {f["name"] for f in writer.files})
    elapsed = time.monotonic() - started
    rows = sum(f["rows"] for f in writer.files)
    manifest = {
        "run": store.uri, "out": out.uri, "format": fmt, "file_type": file_type,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rows": rows, "files": writer.files,
        "data_rows": picks.data_rows, "keys": picks.keys,
        "older_versions_skipped": picks.data_rows - picks.keys,
        **rows_pass.fields(store),
        "elapsed_s": round(elapsed, 3), "rows_per_s": round(rows / max(elapsed, 1e-9), 1),
    }
    write_json_atomic(out.join(MANIFEST), manifest)
    return manifest


def render(m: dict[str, Any]) -> str:
    dropped = ", ".join(f"{k} {v:,}" for k, v in m["dropped"].items() if v) or "none"
    return "\n".join([
        f"exported {m['rows']:,} rows ({m['format']}, {m['file_type']}) to {m['out']} in "
        f"{len(m['files'])} file(s), {m['elapsed_s']:.1f} s ({m['rows_per_s']:,.0f} rows/s)",
        f"  read:     {m['data_rows']:,} data rows, {m['keys']:,} keys "
        f"(latest version each; {m['older_versions_skipped']:,} older versions skipped)",
        f"  dropped:  {dropped}",
        *render_lines(m.get("template_check")),
        *token_yield.render_lines(m.get("token_yield")),
        f"  manifest: {m['out']}/{MANIFEST}",
    ])


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m jobs.analysis.export` and `raygen export`."""
    add_run_args(parser)
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="record shape: pretokenized (input_ids + loss_mask), "
                             "conversations (SpecForge/speculators), messages (HF/TRL)")
    parser.add_argument("--out", required=True, metavar="URI",
                        help="output folder: local path or s3://bucket/prefix")
    parser.add_argument("--file-type", choices=FILE_TYPES, default="jsonl",
                        help="shard files (default jsonl)")
    parser.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE, metavar="N",
                        help=f"rows per shard (default {ROWS_PER_FILE:,}; ~256 MiB at most)")
    parser.add_argument("--include-truncated", action="store_true",
                        help="keep rows cut at the budget (finish_reason=length); "
                             "default: finished rows (stop) only")
    parser.add_argument("--require-finished-thinking", action="store_true",
                        help="drop rows that never reached </think>")
    parser.add_argument("--max-repetition-ratio", type=float, default=None, metavar="R",
                        help="drop rows whose repeated-4-gram share exceeds R (0..1)")
    parser.add_argument("--max-length", type=int, default=None, metavar="N",
                        help="drop rows longer than N tokens (prompt + output)")
    parser.add_argument("--category", action="append", default=[], metavar="C",
                        help="keep only this category (repeat for several)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME",
                        help="keep only rows of this sampling setting (a job.sampling mix's "
                             "name; repeat for several)")
    parser.add_argument("--keep-flagged", action="store_true",
                        help="keep rows with integrity flags (empty answer, missing </think>, "
                             "token runs, n-gram loops, U+FFFD); default: left out, counted "
                             "in the manifest")
    parser.add_argument("--force", action="store_true",
                        help="export even though progress.json says the run is running")
    parser.add_argument("--incremental", action="store_true",
                        help="export only the rows new since the last --incremental call "
                             "to --out (also while the run goes on): one batch of shards "
                             "+ batch-NNNNN.manifest per call; later versions supersede "
                             "earlier records (docs/export.md: Export while generating)")
    parser.add_argument("--trainer-max-length", type=token_yield.parse_length, default=None,
                        metavar="N", help="the drafter trainer's max length (prompt + "
                        "output tokens): the manifest's token_yield says, per category, the "
                        "output tokens it trains on and cuts, and their GPU time")
    parser.add_argument("--extra-columns", default=None, metavar="LIST",
                        help="add accept_length, category and/or setting to each record")
    parser.add_argument("--check-template", default=None, metavar="TOK",
                        help="re-render chat records with tokenizer TOK (a folder, or "
                             "`model`: engine.model_path) and compare with the sampled ids")
    parser.add_argument("--max-template-mismatch", type=float, default=None, metavar="SHARE",
                        help="refuse above this share of differing rows (default 0.01)")
    parser.add_argument("--allow-template-mismatch", action="store_true",
                        help="write the export whatever the mismatch")


def filters_from_args(args: argparse.Namespace) -> Filters:
    if args.rows_per_file < 1:
        fail("--rows-per-file must be >= 1")
    if args.max_repetition_ratio is not None and not 0 <= args.max_repetition_ratio <= 1:
        fail(f"--max-repetition-ratio must be within 0..1, got {args.max_repetition_ratio}")
    if args.max_length is not None and args.max_length < 1:
        fail(f"--max-length must be >= 1, got {args.max_length}")
    return Filters(include_truncated=args.include_truncated,
                   require_finished_thinking=args.require_finished_thinking,
                   max_repetition_ratio=args.max_repetition_ratio, max_length=args.max_length,
                   categories=tuple(args.category), keep_flagged=args.keep_flagged,
                   settings=tuple(args.setting))


def run(args: argparse.Namespace) -> int:
    """Export from parsed arguments (run, config and the export options)."""
    filters = filters_from_args(args)
    try:
        extras = () if args.extra_columns is None else extra_columns.parse(args.extra_columns)
        template = TemplateCheck.from_args(args)
    except (ValueError, TemplateCheckError) as exc:
        fail(str(exc))
    store = open_args(args)
    require_run(store)
    try:
        if args.incremental:
            batch = incremental_export.export_incremental(
                store, args.out, args.format, filters, args.file_type, args.rows_per_file,
                extras, template, trainer_max_length=args.trainer_max_length)
            print(incremental_export.render(batch, args.out))
            return 0
        manifest = export(store, args.out, args.format, filters, args.file_type,
                          args.rows_per_file, args.force, extras, template,
                          trainer_max_length=args.trainer_max_length)
    except (ExportError, export_journal.JournalError) as exc:
        fail(str(exc))
    except OSError as exc:  # unreachable endpoint, no bucket, no permission
        fail(f"export of {store.uri} to {args.out} failed: {' '.join(str(exc).split())}")
    print(render(manifest))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.analysis.export", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Export a run's latest rows as drafter training data (JSONL/Parquet "
                    "shards + export.manifest).",
        epilog="example:\n  python -m jobs.analysis.export s3://bucket/runs/demo --format pretokenized "
               "--out s3://bucket/exports/demo-pretok --config jobs/configs/demo.yaml")
    add_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
