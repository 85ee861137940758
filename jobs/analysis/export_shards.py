"""What a full export (export.py) and an incremental batch (incremental_export.py) share:
the formats and their records, the filters, the shard writer, the pass that reads,
filters, tallies and writes the rows, and where the output goes. A module of its own so
neither export module imports the other."""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract.thinking import THINK_END, THINK_START
from jobs.analysis import extra_columns, token_yield
from jobs.analysis.template_check import TemplateCheck
from jobs.pipeline import turns as every_turn
from contract.integrity import integrity_flags
from jobs.io.run_store import PROVENANCE_FILE, RunStore
from jobs.io.storage import Location, delete_file, list_files, locate, write_bytes_atomic

FORMATS = ("pretokenized", "conversations", "messages")
FILE_TYPES = ("jsonl", "parquet")
ROWS_PER_FILE = 10_000
MAX_SHARD_BYTES = 256 << 20
MANIFEST = "export.manifest"
SHARD_NAME = re.compile(r"^part-\d{5}\.(jsonl|parquet)$")
RUN_FOLDERS = ("data", "failures", "rejects", "final")
FILTER_COLUMNS = ["category", "finish_reason", "finished_thinking", "repetition_ratio",
                  "prompt_token_ids", "output_token_ids", "integrity_flags", "setting"]
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
    settings: tuple[str, ...] = ()           # a sampling mix's settings; empty = every one

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
        if self.settings:
            chosen = pa.array(list(self.settings))
            out.append(("setting", lambda t: pc.is_in(t["setting"], chosen)))
        return out

    def as_json(self) -> dict[str, Any]:
        """The filters as a manifest or journal records them (``settings`` only when set:
        an incremental export's journal from before it compares equal)."""
        out = {**self.__dict__, "categories": list(self.categories)}
        settings = out.pop("settings")
        return {**out, "settings": list(settings)} if settings else out

    @classmethod
    def of_json(cls, fields: dict[str, Any]) -> "Filters":
        return cls(**{**fields, "categories": tuple(fields["categories"]),
                      "settings": tuple(fields.get("settings", ()))})

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
            "filters": self.filters.as_json(),
            "extra_columns": list(self.extras),
            "template_check": self.template.report() if self.template is not None else None,
            "token_yield": self.yields.result() if self.yields is not None else None,
            "provenance": store.read_json(PROVENANCE_FILE),  # jobs/runs/provenance.py
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
