"""A part's sidecar: what the run index needs from one part, a few bytes per row.

    <run>/index/<kind>/<part name>.arrow

One Arrow IPC file per part, written by RunStore.write_part once the part has read back
whole (part first: a crash in between leaves a part without a sidecar, which the run
index rebuilds from the part and writes back; the part is the truth). Columns, one row
per part row in the part's order:

- data:     digest (uint64 of the row's identity with the run's salt: its key's digest,
            with its sample mixed in when it has one, jobs/io/samples.py), version,
            created_ms,
            finish (finish_reason, dictionary), tokens (completion_tokens), prompt
            (digest of prompt_hash, 0 when none), settings (settings_hash, dictionary)
- failures: digest
- rejects:  reject_id (content identity; parts that predate it: source:line)

Schema metadata: the part's size in bytes (a sidecar whose size differs from the listed
part's describes an earlier upload of that name: stale, rebuilt), the sha256 of the
part's bytes (format 2; readers of whole parts check it, so bytes that changed without
changing the size are damage, not data), the outcome events
(failures/retries/rejects by class, for the job's counters) and, for data, the rows per
(settings_hash, first budget), which resume checks against the config. Format 3 adds
key_salt_id: which salt the digests were made with (jobs/io/digests.py); a sidecar of
another salt than the run's, or an unsalted one (formats 1 and 2) in a salted run, is
rebuilt from its part.

Format 4 adds the report's per-row statistics to data sidecars (STATS_COLUMNS, the
report columns the sidecar did not already hold: category, thinking, prompt/reasoning
tokens, budgets, continuations, speculative, repetition, latency, replica; strings as
dictionaries) and writes its buffers zstd-compressed, so the end-of-session report reads
sidecars, never a data part (jobs/analysis/report.py). The run index never keeps them:
it takes its per-key columns and drops the table. A format 1-3 sidecar stays valid; the
report reads its part's columns instead (``has_stats``).

Format 5 adds ``integrity_flags`` (contract/integrity.py) to the statistics, so the
report counts the latest rows an engine broke without reading a part. A format-4 sidecar
answers every other statistic; its part is read for that one column (``served``).

Format 6 adds ``setting`` (a sampling mix's setting name per row, jobs/pipeline/
sampling_mix.py), so the report splits by setting from sidecars. A part whose sidecar is
older was written before the column existed (raygen writes format 6 for every part it
writes or rebuilds), so an older sidecar answers it as nulls, no part read
(``STATS_NULL_BEFORE``): an upgraded run's report costs what it did.
"""

from __future__ import annotations

import collections
import json
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from jobs.io.digests import digests_of, salt_id
from jobs.io.samples import sample_digests
from jobs.io.schema import DATA

# Format 2 adds part_sha256; format 1 sidecars (written before it) are read as they are:
# their parts are checked by Parquet's own page checksums only. Format 3 adds key_salt_id;
# 1 and 2 are unsalted. Format 4 adds STATS_COLUMNS to data sidecars; format 5 adds
# integrity_flags to them.
FORMAT = "6"
READABLE_FORMATS = ("1", "2", "3", "4", "5", "6")
# Data columns a format-4 sidecar keeps per row as they are in the part (the report's);
# version, created_at, finish_reason, completion_tokens and settings_hash it has already.
STATS_COLUMNS = ["category", "finished_thinking", "prompt_tokens", "reasoning_tokens",
                 "max_new_tokens", "effective_max_new_tokens", "budget_clamped_by",
                 "continuations", "spec_verify_ct", "repetition_ratio", "latency_s",
                 "replica", "max_thinking_tokens", "integrity_flags", "setting"]
STATS_ADDED = {"integrity_flags": "5"}   # statistics a later format added: since which
# Statistics a later format added whose column no part written before it holds: an older
# sidecar answers them as nulls (its part is not read).
STATS_NULL_BEFORE = {"setting": "6"}
# Every data column a format-5 sidecar answers per row (``stats``): the report's.
SERVED = ["version", "finish_reason", "completion_tokens", "settings_hash", "created_at",
          *STATS_COLUMNS]
_DICTIONARY = {"category", "budget_clamped_by", "replica", "setting"}  # few distinct values
_WRITE = pa.ipc.IpcWriteOptions(compression="zstd")
INDEX = "index"   # <run>/index/<kind>/
SUFFIX = ".arrow"
# Part columns a summary is made from (what a rebuild reads).
SOURCE_COLUMNS = {
    "data": ["key", "version", "created_at", "finish_reason", "completion_tokens",
             "prompt_hash", "settings_hash", "budget_history", "retry_classes",
             *STATS_COLUMNS, "sample"],
    "failures": ["key", "error_class", "retry_classes", "sample"],
    "rejects": ["source", "line", "reject_id", "reason"],
}


def reject_reason_class(reason: str) -> str:
    """Bounded label of a rejects/ row's reason: the rejects events a sidecar records
    (the job's counter) and the report's reject table."""
    if reason.startswith("duplicate id"):
        return "duplicate_id"
    if reason.startswith("context_overflow"):
        return "context_overflow"
    if reason.startswith("not valid JSON"):
        return "invalid_json"
    return "invalid_row"


class BadSidecar(ValueError):
    """Sidecar bytes that are not a summary of the part they sit beside."""


def sidecar_name(part_name: str) -> str:
    return part_name.removesuffix(".parquet") + SUFFIX


def reject_ids(table: pa.Table) -> list[str]:
    """Each reject's identity: its reject_id, or source:line for parts older than it."""
    ids = table.column("reject_id").to_pylist()
    return [i or f"{s}:{n}" for i, s, n in zip(ids, table.column("source").to_pylist(),
                                                table.column("line").to_pylist())]


def _digests(column: pa.ChunkedArray, salt: bytes) -> pa.Array:
    return pa.array(digests_of(column.to_pylist(), salt), pa.uint64())


def _identities(table: pa.Table, salt: bytes) -> pa.Array:
    """The rows' identity digests: (key, sample) when the part has samples (n > 1)."""
    digests = digests_of(table.column("key").to_pylist(), salt)
    if "sample" in table.column_names and table.column("sample").null_count < table.num_rows:
        samples = pc.fill_null(table.column("sample"), 0).to_numpy()
        digests = sample_digests(digests, samples)
    return pa.array(digests, pa.uint64())


def _retries(table: pa.Table) -> collections.Counter:
    return collections.Counter(c for classes in table.column("retry_classes").to_pylist()
                               for c in classes or ())


def summarize(kind: str, table: pa.Table, part_bytes: int,
              part_sha256: Optional[str] = None, salt: bytes = b"") -> pa.Table:
    """The sidecar of a part holding ``table`` (at least SOURCE_COLUMNS[kind]); its key
    digests use the run's ``salt``."""
    meta: dict[str, Any] = {"events": {}}
    if kind == "data":
        budgets = pc.list_element(table.column("budget_history").combine_chunks(), 0) \
            if table.num_rows else pa.array([], pa.int32())
        counts = collections.Counter(zip(table.column("settings_hash").to_pylist(),
                                         budgets.to_pylist()))
        meta["budgets"] = [[h, b, n] for (h, b), n in sorted(counts.items(), key=str)]
        meta["events"]["retries"] = _retries(table)
        cols = {
            "digest": _identities(table, salt),
            "version": pc.fill_null(table.column("version"), 0).cast(pa.int32()),
            "created_ms": pc.fill_null(table.column("created_at").cast(pa.int64()), 0),
            "finish": table.column("finish_reason").dictionary_encode(),
            "tokens": pc.fill_null(table.column("completion_tokens"), 0).cast(pa.int32()),
            "prompt": _digests(table.column("prompt_hash"), salt),
            "settings": table.column("settings_hash").dictionary_encode(),
        }
        for name in STATS_COLUMNS:
            column = table.column(name).cast(DATA.field(name).type)
            cols[name] = column.dictionary_encode() if name in _DICTIONARY else column
    elif kind == "failures":
        meta["events"]["failures"] = collections.Counter(
            (c or "").removeprefix("continuation:") for c in table.column("error_class").to_pylist())
        meta["events"]["retries"] = _retries(table)
        cols = {"digest": _identities(table, salt)}
    else:
        meta["events"]["rejects"] = collections.Counter(
            reject_reason_class(r or "") for r in table.column("reason").to_pylist())
        cols = {"reject_id": pa.array(reject_ids(table), pa.string())}
    summary = pa.table(cols)
    return summary.replace_schema_metadata({
        "format": FORMAT, "kind": kind, "part_bytes": str(part_bytes),
        "part_sha256": part_sha256 or "", "key_salt_id": salt_id(salt),
        "summary": json.dumps(meta, sort_keys=True)})


def encode(summary: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, summary.schema, options=_WRITE) as writer:
        writer.write_table(summary)
    return sink.getvalue().to_pybytes()


def decode(data: bytes, kind: str, part_bytes: Optional[int], salt: bytes = b"") -> pa.Table:
    """The summary in ``data``; BadSidecar if it is unreadable, of another kind or format,
    describes a part of another size (``part_bytes`` None: any, e.g. a quarantined part's
    sidecar read for the keys it had), or has digests of another salt than ``salt``."""
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise BadSidecar(f"unreadable: {exc}") from exc
    meta = table.schema.metadata or {}
    if (meta.get(b"format", b"").decode() not in READABLE_FORMATS
            or meta.get(b"kind") != kind.encode()):
        raise BadSidecar(f"not a {kind} sidecar of format {'/'.join(READABLE_FORMATS)}")
    if part_bytes is not None and meta.get(b"part_bytes") != str(part_bytes).encode():
        raise BadSidecar(f"describes a part of {meta.get(b'part_bytes', b'?').decode()} "
                         f"bytes, the part has {part_bytes}")
    if meta.get(b"key_salt_id", b"").decode() != salt_id(salt):  # formats 1, 2: unsalted
        raise BadSidecar("its key digests use another salt than the run's")
    return table


def has_stats(summary: pa.Table) -> bool:
    """Whether a data sidecar holds the report's statistics (format 4 and later; a
    format-4 one without those STATS_ADDED since)."""
    return (set(STATS_COLUMNS) - set(STATS_ADDED) - set(STATS_NULL_BEFORE)
            <= set(summary.column_names))


def served(summary: pa.Table, columns: list[str]) -> list[str]:
    """Those of ``columns`` a sidecar with statistics answers (the rest: its part's)."""
    held = set(summary.column_names)
    return [c for c in columns if c not in STATS_ADDED or c in held]


def stats(summary: pa.Table, rows: pa.Array, columns: list[str]) -> pa.Table:
    """``columns`` (data column names) of the part's ``rows``, from its format-4 sidecar,
    typed as the part's own columns: what reading them from the part gives."""
    base = {"version": "version", "finish_reason": "finish", "completion_tokens": "tokens",
            "settings_hash": "settings", "created_at": "created_ms"}
    return as_part_columns(summary.take(rows), columns, base)


def as_part_columns(stored: pa.Table, columns: list[str],
                    names: Optional[dict[str, str]] = None) -> pa.Table:
    """``columns`` (data column names) of ``stored`` rows kept with dictionaries and
    other types (``names``: a column's name there, if not its own), typed as a data
    part's columns."""
    arrays = []
    for name in columns:
        held = (names or {}).get(name, name)
        if held not in stored.column_names and name in STATS_NULL_BEFORE:
            arrays.append(pa.nulls(stored.num_rows, DATA.field(name).type))
            continue  # an older sidecar or stats object: a part without the column
        column = stored.column(held)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        arrays.append(column.cast(DATA.field(name).type))
    return pa.table(arrays, schema=pa.schema([DATA.field(n) for n in columns]))


def checksum(summary: pa.Table) -> Optional[str]:
    """The sha256 of the part's bytes the sidecar recorded (None for format 1)."""
    return (summary.schema.metadata or {}).get(b"part_sha256", b"").decode() or None


def details(summary: pa.Table) -> dict[str, Any]:
    """The summary's metadata: {"events": {metric: {label: n}}, "budgets": [[h, b, n]]}."""
    return json.loads(summary.schema.metadata[b"summary"])
