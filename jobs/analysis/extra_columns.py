"""Optional per-row columns in an export (`--extra-columns accept_length,category`).

A drafter learns most from the rows it drafts worst: with `accept_length` (the target's
accepted tokens per verify step when the row was generated with speculative decoding;
null without it) and `category` in every record, a trainer can up-weight or select the
low-acceptance rows, or balance categories, without joining the export back to the run.

Design decisions:
- A fixed, documented set (EXTRA_COLUMNS), not any data column: each one has one type in
  every shard (Parquet schema, JSON value), and the list stays small enough to document.
- Off by default: the records stay exactly the trainers' documented shapes unless asked.
- The values are appended after the format's own keys, in the order given, under the
  data/ column's name; JSON null (Parquet null) where the run has none (accept_length
  without speculative decoding). The pretokenized JSONL fast path gets the same bytes as
  json.dumps of the record with the extra keys (spliced before its closing brace).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

import pyarrow as pa

from jobs.io.schema import DATA, LOGPROB_COLUMNS

EXTRA_COLUMNS: dict[str, pa.DataType] = {
    "accept_length": pa.float64(), "category": pa.string(),
    "setting": pa.string(),  # a mix's setting name
    # job.logprobs' per output token lists, null for a run without it (docs/logprobs.md)
    **{name: DATA.field(name).type for name in LOGPROB_COLUMNS}}
# Not a flag: every record of a run with job.samples_per_prompt > 1 ends with its sample
# (0..n-1), the same way; a run of one sample per prompt never has it (records unchanged).
SAMPLE = "sample"
TYPES: dict[str, pa.DataType] = {**EXTRA_COLUMNS, SAMPLE: pa.int32()}


def parse(text: str) -> tuple[str, ...]:
    """`accept_length,category` -> ("accept_length", "category"); ValueError names the flag."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in EXTRA_COLUMNS]
    if unknown or not names:
        raise ValueError(f"--extra-columns {text!r}: unknown column(s) "
                         f"{', '.join(unknown) or '(none given)'}; one or more of "
                         f"{', '.join(EXTRA_COLUMNS)}, comma-separated")
    if len(set(names)) != len(names):
        raise ValueError(f"--extra-columns {text!r} names a column twice")
    return names


def read_columns(extras: Iterable[str], already: Iterable[str]) -> list[str]:
    """The data/ columns to read in addition to the export's own."""
    seen = set(already)
    return [n for n in extras if n not in seen]


def schema(base: pa.Schema, extras: Iterable[str]) -> pa.Schema:
    for name in extras:
        base = base.append(pa.field(name, TYPES[name]))
    return base


def record(rec: dict[str, Any], row: dict[str, Any], extras: tuple[str, ...]) -> dict[str, Any]:
    if not extras:
        return rec
    return {**rec, **{name: row[name] for name in extras}}


def lines(encoded: Iterable[bytes], t: pa.Table, extras: tuple[str, ...]) -> Iterator[bytes]:
    """JSONL lines (`{...}\\n`) with the extra keys added before the closing brace."""
    if not extras:
        yield from encoded
        return
    values = [t[name].to_pylist() for name in extras]
    for line, *vals in zip(encoded, *values):
        tail = "".join(f", {json.dumps(n)}: {json.dumps(v, ensure_ascii=False)}"
                       for n, v in zip(extras, vals))
        yield line[:-2] + tail.encode() + b"}\n"
