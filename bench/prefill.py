"""Pre-filled runs for the scale benchmark: N held rows in the real part format.

``input_file(work_dir, n)`` writes n synthetic prompts (ids ``s000000000``...); the
first ``held`` of them become a run's data/ parts, 256 rows each, written by
``RunStore.write_part`` (the sink's own call, so the bytes, names and anything written
beside a part are what a real run has) into a local cache folder, once per
(held, settings_hash). ``upload`` copies that folder to a fresh S3 run prefix with
parallel threads; the upload is not what the benchmark times.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from bench.prompts import cached_jsonl
from jobs.config import RunConfig, StorageConfig
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA, TIMESTAMP
from jobs.io.storage import locate
from jobs.io.run_index import row_ids
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
    sampling = json.dumps(cfg.job.sampling.to_sglang(), sort_keys=True)

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
    }
    return pa.table([cols[f.name] for f in DATA], names=DATA.names).cast(DATA)  # schema order


def cached_run(work_dir: Path, held: int, cfg: RunConfig, settings_hash: str,
               threads: int = 8) -> Path:
    """A local run folder holding rows 0..held in parts (built once, then reused)."""
    root = work_dir / f"prefill-{held}-{settings_hash.replace(':', '')[:16]}"
    done = root / "COMPLETE"
    if done.exists():
        return root / "run"
    store = RunStore(str(root / "run"), StorageConfig())

    def write(start: int) -> None:
        part = data_part(start, min(start + ROWS_PER_PART, held), cfg, settings_hash)
        store.write_part("data", part, row_ids("data", part))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, range(0, held, ROWS_PER_PART)))
    done.write_text(f"{held} rows\n")
    return root / "run"


def upload(local_run: Path, run_uri: str, storage: StorageConfig) -> None:
    """Copy a cached run folder to ``run_uri`` (every file, in parallel)."""
    dest = locate(run_uri, storage)
    pafs.copy_files(str(local_run), dest.path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=dest.fs, use_threads=True)
