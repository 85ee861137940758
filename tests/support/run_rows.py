"""Synthetic runs for tests that read runs back: rows that match jobs.io.schema exactly."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA, FAILURES, REJECTS

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def make_row(key: str, version: int = 0, **over: Any) -> dict[str, Any]:
    """A data row with every DATA column; override any field by keyword."""
    tokens = over.pop("completion_tokens", 1000)
    budget = over.pop("max_new_tokens", 4096)
    row = {
        "key": key, "id": key, "version": version, "category": "chat",
        "messages": '[{"role": "user", "content": "hi"}]', "tools": None,
        "reasoning": "r", "answer": "a", "finished_thinking": True,
        "prompt_token_ids": [1, 2, 3], "output_token_ids": [4, 5],
        "finish_reason": "stop", "matched_stop": "151645", "prompt_tokens": 100,
        "completion_tokens": tokens, "cached_tokens": 0, "reasoning_tokens": tokens // 2,
        "max_new_tokens": budget, "effective_max_new_tokens": budget,
        "budget_clamped_by": "", "budget_history": [budget], "continuations": version,
        "spec_verify_ct": None, "accept_length": None, "repetition_ratio": 0.01,
        "latency_s": 1.0, "attempts": 1, "retry_classes": [], "replica": "r0", "model": "m",
        "sampling": "{}", "settings_hash": "h1",
        "created_at": T0 + dt.timedelta(seconds=version), "prompt_hash": None,
        "integrity_flags": [], "max_thinking_tokens": None, "sample": None, "seed": None,
        "turns": None, "turn_stop": None, "setting": None, "output_logprobs": None,
        "output_top_logprob_ids": None, "output_top_logprobs": None,
    }
    assert set(row) | set(over) == set(DATA.names), set(over) - set(DATA.names)
    row.update(over)
    return row


def write_rows(store: RunStore, kind: str, rows: list[dict[str, Any]],
               per_file: int = 50) -> None:
    """Write rows as several part files, like the job's sink does."""
    schema = {"data": DATA, "failures": FAILURES, "rejects": REJECTS}[kind]
    for start in range(0, len(rows), per_file):
        chunk = rows[start:start + per_file]
        table = pa.Table.from_pylist(chunk, schema=schema)
        ids = [f"{r.get('key')}:{r.get('version', '')}:{r.get('line', '')}" for r in chunk]
        store.write_part(kind, table, ids)


def failure_row(key: str, error_class: str, seconds: int = 0) -> dict[str, Any]:
    return {"key": key, "id": key, "category": "chat", "messages": "[]", "tools": None,
            "source": "in.jsonl", "line": 1, "error_class": error_class,
            "error_message": "boom", "retryable": True, "attempts": 4, "retry_classes": ["engine_5xx"] * 3, "replica": "r0",
            "settings_hash": "h1", "failed_at": T0 + dt.timedelta(seconds=seconds)}


def reject_row(line: int, reason: str) -> dict[str, Any]:
    return {"source": "in.jsonl", "line": line, "key": None, "id": None,
            "reason": reason, "raw": "{", "rejected_at": T0}


def lognormal_lengths(n: int, median: float, sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.ceil(np.exp(rng.normal(math.log(median), sigma, n))).astype(int)


def censor(lengths: Iterable[int], cap: int):
    """(completion_tokens, finish_reason) as a run with this cap would record them."""
    lengths = np.asarray(list(lengths))
    cut = lengths > cap
    return np.where(cut, cap, lengths), np.where(cut, "length", "stop")


def sidecar_as_format_3(store: RunStore, kind: str, part_name: str) -> None:
    """Rewrite a part's sidecar as raygen before format 4 wrote it: no report statistics,
    uncompressed, format 3 (a run written by an earlier version)."""
    from jobs.io import part_summary
    _rewrite_sidecar(store, kind, part_name, "3", part_summary.STATS_COLUMNS)


def sidecar_as_format_4(store: RunStore, kind: str, part_name: str) -> None:
    """Rewrite a part's sidecar as raygen before format 5 wrote it: the statistics but
    integrity_flags, format 4 (a run written by the previous version)."""
    from jobs.io import part_summary
    _rewrite_sidecar(store, kind, part_name, "4", list(part_summary.STATS_ADDED)
                     + list(part_summary.STATS_NULL_BEFORE))


def sidecar_as_format_5(store: RunStore, kind: str, part_name: str) -> None:
    """Rewrite a part's sidecar as raygen before format 6 wrote it: no setting."""
    from jobs.io import part_summary
    _rewrite_sidecar(store, kind, part_name, "5", list(part_summary.STATS_NULL_BEFORE))


def _rewrite_sidecar(store: RunStore, kind: str, part_name: str, fmt: str,
                     dropped: list[str]) -> None:
    loc = store.sidecar_loc(kind, part_name)
    with open(loc.path, "rb") as f:
        table = pa.ipc.open_file(pa.py_buffer(f.read())).read_all()
    table = table.drop_columns([c for c in dropped if c in table.column_names])
    table = table.replace_schema_metadata({**table.schema.metadata, b"format": fmt.encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with open(loc.path, "wb") as f:
        f.write(sink.getvalue().to_pybytes())
