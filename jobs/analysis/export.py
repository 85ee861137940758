"""Export a run as training data for a drafter, in the trainers' own formats.

    python -m jobs.analysis.export RUN --format pretokenized|conversations|messages --out URI
        [--file-type jsonl|parquet] [--include-truncated] [--require-finished-thinking]
        [--max-repetition-ratio R] [--max-length N] [--category C ...] [--config FILE]
        [--extra-columns accept_length,category]
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

--extra-columns appends the rows' accept_length / category to every record
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
import hashlib
import io
import json
import posixpath
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract.thinking import THINK_END, THINK_START
from jobs.analysis import export_journal, extra_columns, template_check, token_yield
from jobs.analysis.finalize import FinalizeError, check_not_running, damage_note, pick_latest
from jobs.analysis.template_check import TemplateCheck, TemplateCheckError, render_lines
from jobs.io.run_index import read_latest
from jobs.pipeline import turns as every_turn
from contract.integrity import integrity_flags
from jobs.io.run_store import RunStore
from jobs.io.storage import (Location, delete_file, list_files, locate, write_bytes_atomic,
                             write_json_atomic)

FORMATS = ("pretokenized", "conversations", "messages")
FILE_TYPES = ("jsonl", "parquet")
ROWS_PER_FILE = 10_000
MAX_SHARD_BYTES = 256 << 20
MANIFEST = "export.manifest"
SHARD_NAME = re.compile(r"^part-\d{5}\.(jsonl|parquet)$")
RUN_FOLDERS = ("data", "failures", "rejects", "final")
FILTER_COLUMNS = ["category", "finish_reason", "finished_thinking", "repetition_ratio",
                  "prompt_token_ids", "output_token_ids", "integrity_flags"]
TEXT_COLUMNS = ["messages", "tools", "reasoning", "answer"]

TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", pa.struct(
    [("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()),
                     ("reasoning_content", pa.string()), ("name", pa.string()),
                     ("tool_call_id", pa.string()), ("tool_calls", pa.list_(TOOL_CALL))])
PARQUET_SCHEMAS = {
    "pretokenized": pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())),
                               ("loss_mask", pa.list_(pa.int8()))]),
    "conversations": pa.schema([("id", pa.string()), ("conversations", pa.list_(MESSAGE)),
                                ("tools", pa.string())]),
    "messages": pa.schema([("id", pa.string()), ("messages", pa.list_(MESSAGE)),
                           ("tools", pa.string())]),
}


class ExportError(RuntimeError):
    """The export cannot run as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Filters:
    include_truncated: bool = False          # keep finish_reason=length rows too
    require_finished_thinking: bool = False  # drop rows that never reached </think>
    max_repetition_ratio: Optional[float] = None
    max_length: Optional[int] = None         # prompt + output tokens
    categories: tuple[str, ...] = ()         # empty = every category
    keep_flagged: bool = False               # keep rows with integrity flags too

    def checks(self) -> list[tuple[str, Callable[[pa.Table], pa.ChunkedArray]]]:
        """(filter name, keep-mask function) in the order they apply; only active ones."""
        reasons = pa.array(["stop", "length"] if self.include_truncated else ["stop"])
        out = [] if self.keep_flagged else [("integrity", lambda t: sound(row_flags(t)))]
        out.append(("finish_reason", lambda t: pc.is_in(t["finish_reason"], reasons)))
        if self.require_finished_thinking:
            out.append(("finished_thinking", lambda t: pc.equal(t["finished_thinking"], True)))
        if self.max_repetition_ratio is not None:
            out.append(("repetition_ratio", lambda t: pc.fill_null(
                pc.less_equal(t["repetition_ratio"], self.max_repetition_ratio), True)))
        if self.max_length is not None:
            out.append(("max_length", lambda t: pc.less_equal(
                pc.add(pc.list_value_length(t["prompt_token_ids"]),
                       pc.list_value_length(t["output_token_ids"])), self.max_length)))
        if self.categories:
            wanted = pa.array(list(self.categories))
            out.append(("category", lambda t: pc.is_in(t["category"], wanted)))
        return out

    def apply(self, t: pa.Table, dropped: dict[str, int]) -> pa.Table:
        for name, keep in self.checks():
            kept = t.filter(pc.fill_null(keep(t), False))
            dropped[name] = dropped.get(name, 0) + t.num_rows - kept.num_rows
            t = kept
        return t


def row_flags(t: pa.Table) -> list[list[str]]:
    """Each row's integrity flags; a row written before raygen recorded them (null) is
    checked now, on the columns read (the text checks need a text format's columns)."""
    stored = t["integrity_flags"].to_pylist()
    if None not in stored:
        return stored
    rows = t.to_pylist()
    return [flags if flags is not None else integrity_flags(row)
            for flags, row in zip(stored, rows)]


def sound(flags: list[list[str]]) -> pa.Array:
    return pa.array([not f for f in flags], pa.bool_())


def tally_flags(flags: list[list[str]], counts: dict[str, int]) -> None:
    for row in flags:
        for flag in row:
            counts[flag] = counts.get(flag, 0) + 1


# --- records -------------------------------------------------------------------------

def without_think_tags(text: Optional[str]) -> str:
    return (text or "").replace(THINK_START, "").replace(THINK_END, "").strip()


def pretokenized_record(row: dict[str, Any]) -> dict[str, Any]:
    prompt, output = row["prompt_token_ids"], row["output_token_ids"]
    return {"id": row["key"], "input_ids": prompt + output,
            "loss_mask": every_turn.loss_mask(len(prompt), len(output), row.get("turns"))}


def _joined_ids(column: pa.ChunkedArray) -> list[str]:
    """Each row's ids as JSON array text without brackets, joined in Arrow (no Python ints)."""
    return pc.binary_join(pc.cast(column, pa.list_(pa.string())), ", ").to_pylist()


def pretokenized_lines(t: pa.Table) -> Iterator[bytes]:
    """JSONL lines byte-identical to json.dumps(pretokenized_record(row)), built from Arrow
    text: JSON-encoding ~2,500 Python ints per row was most of the export's time. Rows
    with turns (job.regenerate every_turn) are encoded whole: their mask has spans."""
    if "turns" in t.column_names and t["turns"].null_count < t.num_rows:
        for row in t.select(["key", "prompt_token_ids", "output_token_ids", "turns"]).to_pylist():
            yield (json.dumps(pretokenized_record(row), ensure_ascii=False) + "\n").encode()
        return
    prompts, outputs = _joined_ids(t["prompt_token_ids"]), _joined_ids(t["output_token_ids"])
    n_prompt = pc.list_value_length(t["prompt_token_ids"]).to_pylist()
    n_output = pc.list_value_length(t["output_token_ids"]).to_pylist()
    for key, p, o, lp, lo in zip(t["key"].to_pylist(), prompts, outputs, n_prompt, n_output):
        ids = f"{p}, {o}" if lp and lo else p + o
        mask = ("0, " * lp + "1, " * lo)[:-2]
        yield (f'{{"id": {json.dumps(key, ensure_ascii=False)}, "input_ids": [{ids}], '
               f'"loss_mask": [{mask}]}}\n').encode()


def chat_turns(row: dict[str, Any]) -> list[dict[str, Any]]:
    if row.get("turns"):  # job.regenerate every_turn: the model's own conversation
        messages = every_turn.conversation(json.loads(row["messages"]), row["turns"])
        last = messages[-1]
        last.update(content=without_think_tags(last["content"]),
                    reasoning_content=without_think_tags(last["reasoning_content"]))
        return messages
    answer = {"role": "assistant", "content": without_think_tags(row["answer"]),
              "reasoning_content": without_think_tags(row["reasoning"])}
    return json.loads(row["messages"]) + [answer]


def conversations_record(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["key"], "conversations": chat_turns(row), "tools": row["tools"] or "[]"}


def messages_record(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["key"], "messages": chat_turns(row), "tools": row["tools"] or "[]"}


RECORDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "pretokenized": pretokenized_record, "conversations": conversations_record,
    "messages": messages_record}


def _parquet_message(msg: dict[str, Any]) -> dict[str, Any]:
    """A turn in MESSAGE's fields; tool-call arguments as JSON text, as OpenAI sends them."""
    calls = []
    for call in msg.get("tool_calls") or []:
        fn = dict(call.get("function") or {})
        if not isinstance(fn.get("arguments"), (str, type(None))):
            fn["arguments"] = json.dumps(fn["arguments"], ensure_ascii=False)
        calls.append({"id": call.get("id"), "type": call.get("type"), "function": fn})
    return {**{name: msg.get(name) for name in MESSAGE.names}, "tool_calls": calls or None}


def to_parquet_rows(fmt: str, records: list[dict[str, Any]],
                    schema: Optional[pa.Schema] = None) -> pa.Table:
    if fmt != "pretokenized":
        records = [{**r, fmt: [_parquet_message(m) for m in r[fmt]]} for r in records]
    return pa.Table.from_pylist(records, schema=schema or PARQUET_SCHEMAS[fmt])


# --- shards --------------------------------------------------------------------------

class ShardWriter:
    """Appends records to the current shard and cuts part-NNNNN files as it fills."""

    def __init__(self, out: Location, fmt: str, file_type: str, rows_per_file: int,
                 extras: tuple[str, ...] = (), prefix: str = "part-"):
        self.out, self.fmt, self.file_type, self.rows_per_file = out, fmt, file_type, rows_per_file
        self.prefix = prefix  # an incremental batch's shards: export_journal.shard_prefix
        self.schema = extra_columns.schema(PARQUET_SCHEMAS[fmt], extras)  # + --extra-columns
        self.files: list[dict[str, Any]] = []
        self._lines: list[bytes] = []              # jsonl: encoded lines
        self._pending: list[dict[str, Any]] = []   # parquet: records not yet in Arrow
        self._tables: list[pa.Table] = []          # parquet: concatenated once, at the cut
        self._rows = self._bytes = 0

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        if self.file_type == "jsonl":
            self.add_lines((json.dumps(r, ensure_ascii=False) + "\n").encode() for r in records)
            return
        for record in records:
            self._pending.append(record)
            self._rows += 1
            if self._rows >= self.rows_per_file:
                self.cut()
        self._to_arrow()
        if self._bytes >= MAX_SHARD_BYTES:
            self.cut()

    def add_lines(self, lines: Iterable[bytes]) -> None:
        """JSONL only: lines already encoded."""
        for line in lines:
            self._lines.append(line)
            self._bytes += len(line)
            self._rows += 1
            if self._rows >= self.rows_per_file or self._bytes >= MAX_SHARD_BYTES:
                self.cut()

    def _to_arrow(self) -> None:
        if self._pending:
            table = to_parquet_rows(self.fmt, self._pending, self.schema)
            self._tables.append(table)
            self._bytes += table.nbytes
            self._pending = []

    def cut(self) -> None:
        """Write the current shard (if it holds rows) and start the next."""
        self._to_arrow()
        if not self._rows:
            return
        if self.file_type == "jsonl":
            data = b"".join(self._lines)
        else:
            buf = io.BytesIO()
            pq.write_table(pa.concat_tables(self._tables), buf, compression="zstd")
            data = buf.getvalue()
        name = f"{self.prefix}{len(self.files):05d}.{self.file_type}"
        write_bytes_atomic(self.out.join(name), data)
        self.files.append({"name": name, "rows": self._rows, "bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()})
        self._lines, self._tables, self._rows, self._bytes = [], [], 0, 0


# --- the export ----------------------------------------------------------------------

class ExportPass:
    """The rows read, filtered, tallied and written to shards: what a full export and
    an incremental batch (incremental_export.py) share."""

    def __init__(self, writer: ShardWriter, fmt: str, filters: Filters,
                 extras: tuple[str, ...], template: Optional[TemplateCheck],
                 yields: Optional[token_yield.YieldTally]):
        self.writer, self.fmt, self.filters, self.extras = writer, fmt, filters, extras
        self.template, self.yields = template, yields
        self.dropped: dict[str, int] = {}
        self.flagged: dict[str, int] = {}  # integrity flag -> rows read that carry it

    def add(self, part: pa.Table) -> pa.Table:
        """Filter and write one part's latest rows; returns the rows kept."""
        tally_flags(row_flags(part), self.flagged)
        kept = self.filters.apply(part, self.dropped)
        if self.yields is not None:  # --trainer-max-length: the rows written, the run's clock
            self.yields.add(part, kept)
        if self.template is not None:  # the rows written, after every filter
            self.template.add(kept, chat_turns)
        if self.fmt == "pretokenized" and self.writer.file_type == "jsonl":
            self.writer.add_lines(extra_columns.lines(pretokenized_lines(kept), kept,
                                                      self.extras))
        else:
            self.writer.add(extra_columns.record(RECORDS[self.fmt](row), row, self.extras)
                            for row in kept.to_pylist())
        return kept

    def fields(self, store: RunStore) -> dict[str, Any]:
        """The manifest fields of what was read and written."""
        return {
            "dropped": dict(self.dropped),
            "integrity_flags": dict(sorted(self.flagged.items())),  # of the rows read
            "filters": {**self.filters.__dict__, "categories": list(self.filters.categories)},
            "extra_columns": list(self.extras),
            "template_check": self.template.report() if self.template is not None else None,
            "token_yield": self.yields.result() if self.yields is not None else None,
            "provenance": store.read_json("provenance.json"),  # jobs/runs/provenance.py
        }


def with_samples(store: RunStore, index, extras: tuple[str, ...]) -> tuple[str, ...]:
    """``extras`` with the sample column first when the run has samples per prompt (every
    row of such a run has one, a run of one sample per prompt none: job.samples_per_prompt
    cannot change between the two, plans.check_samples), read from one winning part."""
    for path in index.winners_by_part():
        t = store.read_part(path, [extra_columns.SAMPLE])
        if t.num_rows:
            has = t.column(extra_columns.SAMPLE).null_count < t.num_rows
            return (extra_columns.SAMPLE,) + extras if has else extras
    return extras


def read_columns(fmt: str, extras: tuple[str, ...], trainer_max_length: Optional[int]
                 ) -> tuple[list[str], Optional[token_yield.YieldTally]]:
    """The data columns an export reads, and the --trainer-max-length tally."""
    columns = ["key"] + FILTER_COLUMNS + (TEXT_COLUMNS if fmt != "pretokenized" else [])
    columns.append("turns")  # job.regenerate every_turn (null in other runs and older parts)
    columns += extra_columns.read_columns(extras, columns)
    yields, yield_columns = token_yield.export_tally(trainer_max_length, columns)
    return columns + yield_columns, yields


def output_location(store: RunStore, out_uri: str) -> Location:
    """Where to write; never into the run's own folders (their readers would see it)."""
    try:
        out = locate(out_uri, store.storage)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    if type(out.fs) is type(store.root.fs):
        for folder in ("",) + RUN_FOLDERS:
            inside = store.loc(folder).path.rstrip("/") if folder else store.root.path
            if out.path == inside or (folder and out.path.startswith(inside + "/")):
                raise ExportError(f"--out {out_uri} is the run's own {folder or 'prefix'}: "
                                  f"write the export elsewhere (e.g. {store.uri}/exports/NAME)")
    return out


def _remove_stale(out: Location, keep: set[str]) -> None:
    for info in list_files(out):
        name = posixpath.basename(info.path)
        if SHARD_NAME.match(name) and name not in keep:
            delete_file(out.fs, info.path)


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
    from jobs.analysis.run_cli import add_run_args
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
                             "earlier records (README: Export while generating)")
    parser.add_argument("--trainer-max-length", type=token_yield.parse_length, default=None,
                        metavar="N", help="the drafter trainer's max length (prompt + "
                        "output tokens): the manifest's token_yield says, per category, the "
                        "output tokens it trains on and cuts, and their GPU time")
    parser.add_argument("--extra-columns", default=None, metavar="LIST",
                        help="add accept_length and/or category to each record")
    parser.add_argument("--check-template", default=None, metavar="TOK",
                        help="re-render chat records with tokenizer TOK (a folder, or "
                             "`model`: engine.model_path) and compare with the sampled ids")
    parser.add_argument("--max-template-mismatch", type=float, default=None, metavar="SHARE",
                        help="refuse above this share of differing rows (default 0.01)")
    parser.add_argument("--allow-template-mismatch", action="store_true",
                        help="write the export whatever the mismatch")


def filters_from_args(args: argparse.Namespace) -> Filters:
    from jobs.analysis.run_cli import fail
    if args.rows_per_file < 1:
        fail("--rows-per-file must be >= 1")
    if args.max_repetition_ratio is not None and not 0 <= args.max_repetition_ratio <= 1:
        fail(f"--max-repetition-ratio must be within 0..1, got {args.max_repetition_ratio}")
    if args.max_length is not None and args.max_length < 1:
        fail(f"--max-length must be >= 1, got {args.max_length}")
    return Filters(include_truncated=args.include_truncated,
                   require_finished_thinking=args.require_finished_thinking,
                   max_repetition_ratio=args.max_repetition_ratio, max_length=args.max_length,
                   categories=tuple(args.category), keep_flagged=args.keep_flagged)


def run(args: argparse.Namespace) -> int:
    """Export from parsed arguments (run, config and the export options)."""
    from jobs.analysis.run_cli import fail, open_args, require_run
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
            from jobs.analysis import incremental_export
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
