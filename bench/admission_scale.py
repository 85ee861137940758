"""Scale of the admission pass (jobs/pipeline/admission.py): memory of the admission structure
at many keys, and the time of the driver's pass over a large input.

    python -m bench.admission_scale --keys 10000000 --rows 900000

``--keys``: builds the pass's key arrays and the admission table from N synthetic
keys (the real digest function and merge path) and prints their bytes, next to the
bytes per key of a Python set of the same key strings (what the old ledger actor held;
measured with tracemalloc on a 1M-key sample). ``--rows``: writes N synthetic JSONL
prompts (0.1% invalid, 0.1% duplicate ids) to a temp dir and times admit_inputs on
them, rejects written to a local run folder. ``--index-keys``: the resume read model
of a run holding N rows as today's driver holds it (jobs/runs/run.py RunState.read: the
data/ columns key, settings_hash, budget_history, prompt_hash as one Arrow table, then
PriorRun's digest arrays; jobs/runs/progress.py RunCounts.latest, a dict of every key,
measured with tracemalloc on a 1M-key sample and scaled), and this process's peak RSS
(run it alone, ``--keys 0 --rows 0``, for a clean figure).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Optional

import numpy as np

from jobs.pipeline.admission import (CHUNK_ROWS, AdmissionTable, PriorRun, SeenKeys, admit_inputs,
                            digests_of, reject_writer)


def key_memory(n: int) -> dict[str, float]:
    seen = SeenKeys()
    started, peak = time.perf_counter(), 0
    for start in range(0, n, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, n)
        seen.add_new(digests_of(f"prompt-{i:09d}" for i in range(start, stop)),
                     np.arange(start, stop, dtype=np.int64))
        peak = max(peak, seen.nbytes)
    table = AdmissionTable(*seen.merged())
    assert len(table) == n
    sample = min(n, 1_000_000)
    tracemalloc.start()
    strings = {f"prompt-{i:09d}" for i in range(sample)}
    set_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del strings
    return {"keys": n, "table_bytes": table.nbytes, "table_bytes_per_key": table.nbytes / n,
            "pass_peak_bytes": peak, "build_s": time.perf_counter() - started,
            "python_set_bytes_per_key": set_bytes / sample}


def index_memory(n: int) -> dict[str, float]:
    import pyarrow as pa

    from jobs.pipeline.admission import PriorRun
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    keys = pa.array([f"s{i:09d}" for i in range(n)])
    columns = pa.table({  # the shapes RunState.read holds: one row per held row
        "key": keys,
        "settings_hash": pa.array(["sha256:" + "0" * 32] * n).dictionary_encode().cast(pa.string()),
        "budget_history": pa.array([[4096]] * n, pa.list_(pa.int32())),
        "prompt_hash": pa.array([f"sha256:{i:032x}" for i in range(n)])})
    def values(name: str):  # a chunk at a time, as RunState.read feeds PriorRun
        for chunk in columns.column(name).chunks:
            yield from chunk.to_pylist()
    prior = PriorRun.from_columns(values("key"), values("prompt_hash"), [], [])
    prior_bytes = prior.done.nbytes + prior.done_prompt.nbytes + prior.failed.nbytes
    sample = min(n, 1_000_000)
    tracemalloc.start()
    latest = {f"s{i:09d}": (0, False, 120 + i % 7) for i in range(sample)}
    dict_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del latest
    return {"keys": n, "arrow_bytes": columns.nbytes, "prior_bytes": prior_bytes,
            "progress_dict_bytes": dict_bytes * n / sample,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "baseline_rss_bytes": baseline}


def synthetic_input(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            if i % 1000 == 999:
                f.write('{"id": "broken", "messages": [\n')
                continue
            row_id = f"p{i - 500:08d}" if i % 1000 == 500 else f"p{i:08d}"  # a duplicate
            f.write(json.dumps({"id": row_id, "category": "chat", "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": f"Question {i}: explain step {i % 7} of "
                                            f"problem {i * 7919 % 100000} in detail."}]}) + "\n")


def pass_time(n: int) -> dict[str, float]:
    from jobs.config import StorageConfig
    from jobs.io.run_store import RunStore
    from jobs.io.storage import locate
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompts.jsonl"
        synthetic_input(path, n)
        store = RunStore(str(Path(tmp) / "run"), StorageConfig())
        started = time.perf_counter()
        result = admit_inputs([locate(str(path), StorageConfig())], PriorRun(), False,
                              reject_writer(store))
        seconds = time.perf_counter() - started
    return {"rows": result.total, "admitted": len(result.table), "rejects": result.rejects,
            "seconds": seconds, "rows_per_s": result.total / seconds,
            "input_mib": path.stat().st_size / 2**20 if path.exists() else float("nan")}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admission_scale",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--rows", type=int, default=900_000)
    parser.add_argument("--index-keys", type=int, default=0)
    args = parser.parse_args(argv)
    if args.index_keys:
        m = index_memory(args.index_keys)
        mib = {k: v / 2**20 for k, v in m.items() if k.endswith("bytes")}
        print(f"resume read model at {m['keys']:,} keys: RunState.read columns "
              f"{mib['arrow_bytes']:,.0f} MiB, PriorRun digests {mib['prior_bytes']:,.0f} MiB, "
              f"progress key dict ~{mib['progress_dict_bytes']:,.0f} MiB (1M-key sample "
              f"scaled); process peak RSS {mib['peak_rss_bytes']:,.0f} MiB (at start "
              f"{mib['baseline_rss_bytes']:,.0f} MiB)", flush=True)
    if args.keys:
        m = key_memory(args.keys)
        print(f"admission table at {m['keys']:,} keys: {m['table_bytes']:,} bytes "
              f"({m['table_bytes_per_key']:.0f} B/key); pass peak {m['pass_peak_bytes']:,} "
              f"bytes; built in {m['build_s']:.1f} s; a Python set of the key strings: "
              f"{m['python_set_bytes_per_key']:.0f} B/key", flush=True)
    if args.rows:
        t = pass_time(args.rows)
        print(f"driver pass over {t['rows']:,} rows: {t['seconds']:.1f} s "
              f"({t['rows_per_s']:,.0f} rows/s), {t['admitted']:,} admitted, "
              f"{t['rejects']:,} rejects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
