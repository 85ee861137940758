"""Pre-filled runs for the scale benchmark: N held rows in the real part format.

``input_file(work_dir, n)`` writes n synthetic prompts (ids ``s000000000``...); the
first ``held`` of them become a run's data/ parts, 256 rows each, written by
``RunStore.write_part`` (the sink's own call, so the bytes, names and anything written
beside a part are what a real run has) into a local cache folder, once per
(held, settings_hash, sidecar format). ``index="after"`` also writes the run's compact
index object and its stats object (jobs/io/index_compact.py, what a session's end
writes) and, with ``recorded_input``, the admission pass over its input recorded
(what the session that wrote them leaves); ``"before"`` is the
same parts with format-3 sidecars (no report statistics) and no compact object: a run
as the previous raygen left it. ``upload`` copies that folder to a fresh S3 run prefix
with parallel threads; the upload is not what the benchmark times.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from bench.prompts import cached_jsonl
from jobs.config import RunConfig, StorageConfig
from jobs.io import index_compact, part_summary
from jobs.io.run_store import RunStore, part_name
from jobs.io.schema import DATA, LOGPROB_COLUMNS, TIMESTAMP, TURN
from jobs.io.run_index import RunIndex, row_ids
from jobs.io.sources import MAX_LINE_BYTES
from jobs.io.storage import list_files, locate, put_verified, read_bytes
from jobs.pipeline import admission_cache, input_fingerprints
from jobs.pipeline.admission import admit_inputs
from jobs.pipeline.validate import canonical_json, prompt_key

ROWS_PER_PART = 256
PROMPT_IDS, OUTPUT_IDS = 16, 64  # token ids stored per row: parts of a realistic shape
COMPLETION_TOKENS = 120


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Scale prompt {i}: summarise step {i % 7} of "
                                        f"problem {i * 7919 % 100_000} in two lines."}]


def input_file(work_dir: Path, rows: int, start: int = 0) -> Path:
    """Prompts start..start+rows as JSONL (cached by name)."""
    return cached_jsonl(work_dir / f"scale-prompts-{start}-{rows}.jsonl",
                        ({"id": f"s{i:09d}", "category": "chat", "messages": messages(i)}
                         for i in range(start, start + rows)))


def _token_lists(rows: int, width: int, seed: int) -> pa.ListArray:
    values = np.random.default_rng(seed).integers(0, 150_000, rows * width, dtype=np.int32)
    offsets = np.arange(0, rows * width + 1, width, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def data_part(start: int, stop: int, cfg: RunConfig, settings_hash: str) -> pa.Table:
    """Rows start..stop as a finished first generation under ``cfg``'s settings."""
    n = stop - start
    msgs = [messages(i) for i in range(start, stop)]
    budget = cfg.job.max_new_tokens
    sampling = json.dumps(cfg.job.main_sampling.to_sglang(), sort_keys=True)

    def same(value, type_=None):
        return pa.array([value] * n, type_)
    cols = {
        "key": pa.array([f"s{i:09d}" for i in range(start, stop)]),
        "id": pa.array([f"s{i:09d}" for i in range(start, stop)]),
        "version": same(0, pa.int32()), "category": same("chat"),
        "messages": pa.array([canonical_json(m) for m in msgs]), "tools": same(None, pa.string()),
        "reasoning": same("thought"), "answer": same("answer"),
        "finished_thinking": same(True),
        "prompt_token_ids": _token_lists(n, PROMPT_IDS, start),
        "output_token_ids": _token_lists(n, OUTPUT_IDS, start + 1),
        "finish_reason": same("stop"), "matched_stop": same(None, pa.string()),
        "prompt_tokens": same(PROMPT_IDS, pa.int32()),
        "completion_tokens": same(COMPLETION_TOKENS, pa.int32()),
        "cached_tokens": same(0, pa.int32()), "reasoning_tokens": same(40, pa.int32()),
        "max_new_tokens": same(budget, pa.int32()),
        "effective_max_new_tokens": same(budget, pa.int32()), "budget_clamped_by": same(""),
        "budget_history": same([budget], pa.list_(pa.int32())),
        "continuations": same(0, pa.int32()), "spec_verify_ct": same(40, pa.int64()),
        "accept_length": same(3.0), "repetition_ratio": same(0.0), "latency_s": same(1.0),
        "attempts": same(1, pa.int32()), "retry_classes": same([], pa.list_(pa.string())),
        "replica": same("bench-prefill"), "model": same(cfg.engine.model_name),
        "sampling": same(sampling), "settings_hash": same(settings_hash),
        "created_at": pa.array(np.full(n, int(time.time() * 1000)), pa.int64()).cast(TIMESTAMP),
        "prompt_hash": pa.array([prompt_key(m, None) for m in msgs]),
        "integrity_flags": same([], pa.list_(pa.string())),
        "max_thinking_tokens": same(None, pa.int32()),
        "sample": same(None, pa.int32()), "seed": same(None, pa.int64()),
        "turns": same(None, pa.list_(TURN)), "turn_stop": same(None, pa.string()),
        "setting": same(None, pa.string()),
    }
    for name in LOGPROB_COLUMNS:  # job.logprobs off
        cols[name] = same(None, DATA.field(name).type)
    return pa.table([cols[f.name] for f in DATA], names=DATA.names).cast(DATA)  # schema order


def cached_run(work_dir: Path, held: int, cfg: RunConfig, settings_hash: str,
               threads: int = 8, index: str = "after") -> Path:
    """A local run folder holding rows 0..held in parts (built once, then reused), with
    its compact index object (``index="after"``), or as the previous raygen wrote it:
    format-3 sidecars, no compact object (``"before"``)."""
    root = work_dir / (f"prefill-{held}-{settings_hash.replace(':', '')[:16]}"
                       f"-f{part_summary.FORMAT}")
    run = root / "run"
    if not (root / "COMPLETE").exists():
        store = RunStore(str(run), StorageConfig())

        def write(start: int) -> None:
            part = data_part(start, min(start + ROWS_PER_PART, held), cfg, settings_hash)
            store.write_part("data", part, row_ids("data", part))
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(write, range(0, held, ROWS_PER_PART)))
        (root / "COMPLETE").write_text(f"{held} rows\n")
    if index == "before":
        return _as_before(run, root / "before")
    store = RunStore(str(run), StorageConfig())
    newest = index_compact.listed(store)[:1]
    if not newest or not os.path.exists(  # a cache made before the stats object
            store.loc(*index_compact.FOLDER, f"{newest[0][0]:08d}.stats.arrow").path):
        index_compact.write(RunIndex.open(store))
    return run


def recorded_input(work_dir: Path, run: Path, held: int) -> Path:
    """The input of the run's sessions so far (rows 0..held) at a fixed path, with the
    admission pass over it recorded in the run (jobs/pipeline/admission_cache.py), as
    the session that generated them left it; built once. A resume appends its new
    lines to this file (``grown``), as a user adds prompts to the input."""
    path = work_dir / f"recorded-input-{held}.jsonl"
    store = RunStore(str(run), StorageConfig())
    if path.exists() and os.path.exists(store.loc(*admission_cache.NAME).path) and \
            path.stat().st_size == input_file(work_dir, held).stat().st_size:
        return path
    path.write_bytes(input_file(work_dir, held).read_bytes())
    inputs = [locate(str(path), StorageConfig())]
    admission = admit_inputs(inputs, RunIndex.open(store), False, lambda rejects: None,
                             keep_keys=True)
    assert len(admission.table) == 0, "the pre-filled run holds every prompt of its input"
    input_fingerprints.record(store, admission.fingerprints)
    assert admission_cache.save(store, inputs, None, MAX_LINE_BYTES, admission)
    return path


class grown:
    """The recorded input with ``new`` more rows appended for the block; cut back to
    its recorded rows after."""

    def __init__(self, work_dir: Path, path: Path, held: int, new: int):
        self.path, self.size = path, input_file(work_dir, held).stat().st_size
        self.tail = input_file(work_dir, new, start=held)

    def __enter__(self) -> Path:
        with open(self.path, "ab") as f:
            f.write(self.tail.read_bytes())
        return self.path

    def __exit__(self, *exc) -> None:
        os.truncate(self.path, self.size)


def synthetic_run(work_dir: Path, held: int, cfg: RunConfig, settings_hash: str) -> Path:
    """A run of ``held`` rows too large to write as parts here (9M rows: 35K parts,
    3.7 GB): 1-byte stand-in parts under the real names, each with the sidecar its rows
    would have (the rows of ``data_part``, summarized by the store's own
    write_sidecar), then the run's compact index and stats objects
    built from them as a session's end does. A resume reads only those objects and the
    listing (jobs/io/index_compact.py); ``upload_synthetic`` leaves the sidecars out.
    Built once under ``work_dir``."""
    root = work_dir / f"synthetic-{held}-{settings_hash.replace(':', '')[:16]}-f{part_summary.FORMAT}"
    run = root / "run"
    if (root / "COMPLETE").exists():
        return run
    store = RunStore(str(run), StorageConfig())
    store.init_run_file()
    stand_in = b"x"
    checksum = hashlib.sha256(stand_in).hexdigest()

    def write(start: int) -> None:
        table = data_part(start, min(start + ROWS_PER_PART, held), cfg, settings_hash)
        name = part_name(row_ids("data", table))
        loc = store.loc("data", name)
        os.makedirs(os.path.dirname(loc.path), exist_ok=True)
        Path(loc.path).write_bytes(stand_in)
        store.write_sidecar("data", name, table, len(stand_in), checksum)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(0, held, ROWS_PER_PART)))
    index_compact.write(RunIndex.open(store))
    (root / "COMPLETE").write_text(f"{held} rows, synthetic\n")
    return run


def upload_synthetic(local_run: Path, run_uri: str, storage: StorageConfig) -> None:
    """``upload`` without the sidecars (the compact objects cover every part)."""
    files = [entry for entry in local_run.rglob("*") if entry.is_file()]

    def put(entry: Path) -> None:
        rel = entry.relative_to(local_run).parts
        if rel[:1] == (part_summary.INDEX,) and rel[1:2] != index_compact.FOLDER[1:]:
            return
        # one plain PUT each (pyarrow's streams make three requests of a multipart upload)
        put_verified(locate(posixpath.join(run_uri, *rel), storage), entry.read_bytes(),
                     storage)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files))


def _as_before(run: Path, before: Path) -> Path:
    """The run's parts (hard links) with format-3 sidecars and no compact object."""
    if (before / "COMPLETE").exists():
        return before / "run"
    for part in (run / "data").iterdir():
        dest = before / "run" / "data" / part.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            os.link(part, dest)
        side = before / "run" / part_summary.INDEX / "data" / part_summary.sidecar_name(part.name)
        side.parent.mkdir(parents=True, exist_ok=True)
        side.write_bytes(as_format_3((run / part_summary.INDEX / "data" / side.name).read_bytes()))
    (before / "COMPLETE").write_text("format 3\n")
    return before / "run"


def as_format_3(sidecar: bytes) -> bytes:
    """A format-4 sidecar as the previous raygen wrote it: no report statistics,
    uncompressed, format 3."""
    table = pa.ipc.open_file(pa.py_buffer(sidecar)).read_all()
    table = table.drop_columns(part_summary.STATS_COLUMNS)
    table = table.replace_schema_metadata({**table.schema.metadata, b"format": b"3"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def sidecar_bytes_per_row(store: RunStore) -> dict[str, float]:
    """Bytes per row of the run's data sidecars as stored, and the same sidecars in
    format 3 (what they were before the report statistics)."""
    rows = now = before = 0
    for info in list_files(store.loc(part_summary.INDEX, "data"), part_summary.SUFFIX):
        data = read_bytes(store.loc(part_summary.INDEX, "data", os.path.basename(info.path)))
        rows += pa.ipc.open_file(pa.py_buffer(data)).read_all().num_rows
        now += len(data)
        before += len(as_format_3(data))
    return {"rows": rows, "format_4": now / max(rows, 1), "format_3": before / max(rows, 1)}


def upload(local_run: Path, run_uri: str, storage: StorageConfig) -> None:
    """Copy a cached run folder to ``run_uri`` (every file, in parallel)."""
    dest = locate(run_uri, storage)
    pafs.copy_files(str(local_run), dest.path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=dest.fs, use_threads=True)
