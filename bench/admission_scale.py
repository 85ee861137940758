"""Scale of the admission pass (jobs/pipeline/admission.py): memory of the admission structure
at many keys, and the time of the driver's pass over a large input.

    python -m bench.admission_scale --keys 10000000 --rows 900000

``--keys``: builds the pass's key arrays and the admission table from N synthetic
keys (the real digest function and merge path) and prints their bytes, next to the
bytes per key of a Python set of the same key strings (what the old ledger actor held;
measured with tracemalloc on a 1M-key sample). ``--rows``: writes N synthetic JSONL
prompts (0.1% invalid, 0.1% duplicate ids) to a temp dir and times admit_inputs on
them, rejects written to a local run folder. ``--index-keys``: the driver's resume read model at N held keys:
a run of N keys as real sidecars (jobs/io/part_summary.py) next to 1-byte stand-in parts
is built once under ``--work``; a fresh interpreter opens it as a resume does
(RunIndex.open, jobs/io/run_index.py) and then builds the admission pass's arrays and
table for N input rows; it prints the open time and that process's peak RSS. With
``--index-compact`` the first open reads every sidecar (RAYGEN_INDEX_COMPACT=0) and then
writes the run's compact index object (jobs/io/index_compact.py, as a session's end
does), and a second fresh interpreter opens the run from it: both printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Optional

import numpy as np

from jobs.io.index_state import COLUMNS, IndexState
from jobs.io.run_index import RunIndex
from jobs.pipeline.admission import CHUNK_ROWS, admit_inputs, digests_of, reject_writer
from jobs.pipeline.admission_table import AdmissionTable
from jobs.pipeline.seen_keys import SeenKeys


def done_index(store, digests: np.ndarray, reject_ids: list[str]) -> RunIndex:
    """A run index holding every key of ``digests`` (sorted) as done and these reject
    ids: what a resume of the whole input opens. Built through the index's own state
    (RunIndex.apply), not tests/support's helper: bench/ imports jobs/ only (tests
    import bench/, tests/unit/bench/), and it needs no more than these few lines."""
    latest = {name: np.zeros(len(digests), dtype) for name, dtype in COLUMNS.items()}
    latest["digest"] = digests
    index = RunIndex(store)
    index.apply(IndexState(latest=latest, reject_ids=set(reject_ids)))
    return index


def key_memory(n: int) -> dict[str, float]:
    seen = SeenKeys()
    started, peak = time.perf_counter(), 0
    for start in range(0, n, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, n)
        seen.add_new(digests_of(f"prompt-{i:09d}" for i in range(start, stop)),
                     np.arange(start, stop, dtype=np.int64))
        peak = max(peak, seen.nbytes)
    table = AdmissionTable(*seen.merged()[:2])
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


def index_run(n: int, root: Path) -> Path:
    """A run of n held keys as real sidecars next to 1-byte stand-in parts: the run index
    opens a run from its sidecars only, so this is what a resume reads (built once)."""
    import datetime as dt

    import pyarrow as pa

    from jobs.io import part_summary
    from jobs.io.schema import DATA
    run = root / f"index-run-{n}-f{part_summary.FORMAT}"
    if (run / "COMPLETE").exists():
        return run
    (run / "data").mkdir(parents=True, exist_ok=True)
    (run / "index" / "data").mkdir(parents=True, exist_ok=True)
    ts = pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)] * 256,
                  DATA.field("created_at").type)
    for p, start in enumerate(range(0, n, 256)):
        m = min(256, n - start)
        keys = [f"s{i:09d}" for i in range(start, start + m)]
        part = pa.table({
            "key": keys, "version": pa.array(np.zeros(m, np.int32)), "created_at": ts[:m],
            "finish_reason": ["stop"] * m,
            "completion_tokens": pa.array(np.full(m, 1000, np.int32)),
            "prompt_hash": [f"sha256:{k}" for k in keys], "settings_hash": ["h"] * m,
            "budget_history": pa.array([[4096]] * m, pa.list_(pa.int32())),
            "retry_classes": pa.array([[]] * m, pa.list_(pa.string())),
            # the report's statistics: kept by the sidecar, never by the index
            **{c: pa.nulls(m, DATA.field(c).type) for c in part_summary.STATS_COLUMNS}})
        (run / "data" / f"part-{p:09d}.parquet").write_bytes(b"x")
        (run / "index" / "data" / f"part-{p:09d}.arrow").write_bytes(
            part_summary.encode(part_summary.summarize("data", part, 1)))
    (run / "COMPLETE").write_text(f"{n}\n")
    return run


NEW_ROWS = 3000  # new prompts of the resume (as bench scale)


def index_memory(n: int, root: Path, compact: str = "") -> dict[str, float]:
    """The driver's resume read model at n held keys, in a fresh interpreter: the run
    index opened (RunIndex.open), then the admission pass's key arrays over an input of
    those n keys + NEW_ROWS new ones, and the table of what to generate, held alongside
    it; peak RSS of that process. ``compact``: "" (as the run is), "off" (from the
    sidecars, then write the compact object), "on" (from the compact object)."""
    import os
    import subprocess
    run = index_run(n, root)
    env = dict(os.environ, RAYGEN_INDEX_COMPACT="0" if compact == "off" else "1")
    code = f"""
import json, resource, time
from jobs.config import StorageConfig
from jobs.io.run_store import RunStore
from jobs.io.run_index import RunIndex
from jobs.pipeline.admission import CHUNK_ROWS, _Pass
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t0 = time.perf_counter()
index = RunIndex.open(RunStore({str(run)!r}, StorageConfig()))
opened = time.perf_counter() - t0
after_open = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
# The pass's own bookkeeping (_Pass.flush / table) over the held keys + NEW_ROWS new
# ones, fed parsed rows directly: parsing 10M JSON lines adds time, not memory.
state_pass = _Pass(index, ["bench"], lambda records: None)
rows = {n} + {NEW_ROWS}
for start in range(0, rows, CHUNK_ROWS):
    state_pass.chunk = [(i, f"s{{i:09d}}", None, f"sha256:s{{i:09d}}", i + 1, "")
                        for i in range(start, min(start + CHUNK_ROWS, rows))]
    state_pass.flush()
table = state_pass.table(retry_failed=False)[0]
written = None
if {compact == "off"!r}:
    import os
    from jobs.io import index_compact
    os.environ["RAYGEN_INDEX_COMPACT"] = "1"
    t1 = time.perf_counter()
    index_compact.write(index)
    written = time.perf_counter() - t1
print(json.dumps({{"keys": len(index.done), "open_s": opened, "to_generate": len(table),
                  "reads": dict(index.reads), "compact_write_s": written,
                  "index_bytes": index.nbytes,
                  "table_bytes": table.nbytes, "baseline_rss_bytes": base,
                  "open_peak_rss_bytes": after_open,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}))
"""
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def synthetic_input(path: Path, n: int, start: int = 0, mode: str = "w") -> None:
    with open(path, mode) as f:
        for i in range(start, start + n):
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
        result = admit_inputs([locate(str(path), StorageConfig())], RunIndex(None), False,
                              reject_writer(store))  # a run holding nothing
        seconds = time.perf_counter() - started
    return {"rows": result.total, "admitted": len(result.table), "rejects": result.rejects,
            "seconds": seconds, "rows_per_s": result.total / seconds,
            "input_mib": path.stat().st_size / 2**20 if path.exists() else float("nan")}


def reuse_time(n: int, new: int = NEW_ROWS) -> dict[str, float]:
    """A resume's admission pass over an input of n rows + ``new`` appended ones, the run
    holding every valid key of the n: the whole pass against going on from the recorded
    one (jobs/pipeline/admission_cache.py), and over the unchanged input."""
    from jobs.config import StorageConfig
    from jobs.io.run_store import RunStore
    from jobs.io.sources import MAX_LINE_BYTES
    from jobs.io.storage import locate
    from jobs.pipeline import admission_cache
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompts.jsonl"
        synthetic_input(path, n)
        store = RunStore(str(Path(tmp) / "run"), StorageConfig())
        store.init_run_file()
        inputs = [locate(str(path), StorageConfig())]
        started = time.perf_counter()
        first = admit_inputs(inputs, RunIndex.open(store), False, lambda part: None,
                             keep_keys=True)
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        admission_cache.save(store, inputs, None, MAX_LINE_BYTES, first)
        save_s = time.perf_counter() - started
        index = done_index(store, first.input_keys[0], first.reject_ids)

        def reused() -> tuple[float, int]:
            started = time.perf_counter()
            rec = admission_cache.load(store, inputs, None, MAX_LINE_BYTES, index)
            result = admit_inputs(inputs, index, False, lambda part: None, recorded=rec)
            return time.perf_counter() - started, len(result.table)
        same_s, _ = reused()
        synthetic_input(path, new, start=n, mode="a")
        started = time.perf_counter()
        whole = admit_inputs(inputs, index, False, lambda part: None)
        whole_s = time.perf_counter() - started
        tail_s, admitted = reused()
        assert admitted == len(whole.table), (admitted, len(whole.table))
    return {"rows": n, "new": new, "first_s": first_s, "save_s": save_s, "whole_s": whole_s,
            "tail_s": tail_s, "same_s": same_s, "admitted": admitted,
            "record_mib": len(first.input_keys[0]) * 20 / 2**20}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admission_scale",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--rows", type=int, default=900_000)
    parser.add_argument("--index-keys", type=int, default=0)
    parser.add_argument("--reuse", type=int, default=0, metavar="ROWS",
                        help="a resume's admission pass over ROWS + 3,000 appended rows: "
                             "whole pass vs going on from the recorded one, side by side")
    parser.add_argument("--index-compact", action="store_true",
                        help="--index-keys: open from the sidecars, write the compact index "
                             "object, open from it (both printed)")
    parser.add_argument("--work", default=".local/bench-scale",
                        help="where --index-keys builds (and reuses) its synthetic run")
    args = parser.parse_args(argv)
    for compact in (("off", "on") if args.index_compact else ("",)) if args.index_keys else ():
        m = index_memory(args.index_keys, Path(args.work), compact)
        mib = {k: v / 2**20 for k, v in m.items() if k.endswith("bytes")}
        source = " + ".join(f"{n:,} {what}" for what, n in sorted(m["reads"].items()))
        written = (f"; compact object written in {m['compact_write_s']:.1f} s"
                   if m.get("compact_write_s") is not None else "")
        print(f"driver at a resume of {m['keys']:,} held keys: run index opened from "
              f"{source} in {m['open_s']:.1f} s ({mib['index_bytes']:,.0f} MiB of key arrays), "
              f"peak RSS {mib['open_peak_rss_bytes']:,.0f} MiB after the open, "
              f"{mib['peak_rss_bytes']:,.0f} MiB after the admission pass over {m['keys']:,} + "
              f"{NEW_ROWS:,} input rows ({m['to_generate']:,} to generate); interpreter at start "
              f"{mib['baseline_rss_bytes']:,.0f} MiB{written}", flush=True)
    if args.keys:
        m = key_memory(args.keys)
        print(f"admission table at {m['keys']:,} keys: {m['table_bytes']:,} bytes "
              f"({m['table_bytes_per_key']:.0f} B/key); pass peak {m['pass_peak_bytes']:,} "
              f"bytes; built in {m['build_s']:.1f} s; a Python set of the key strings: "
              f"{m['python_set_bytes_per_key']:.0f} B/key", flush=True)
    if args.reuse:
        r = reuse_time(args.reuse)
        print(f"resume admission over {r['rows']:,} held + {r['new']:,} appended rows "
              f"({r['admitted']:,} to generate): whole pass {r['whole_s']:.1f} s, going on "
              f"from the recorded pass {r['tail_s']:.2f} s ({r['whole_s'] / r['tail_s']:.0f}x); "
              f"input unchanged {r['same_s']:.2f} s; the first pass {r['first_s']:.1f} s + "
              f"recording it {r['save_s']:.2f} s (~{r['record_mib']:.0f} MiB of keys)",
              flush=True)
    if args.rows:
        t = pass_time(args.rows)
        print(f"driver pass over {t['rows']:,} rows: {t['seconds']:.1f} s "
              f"({t['rows_per_s']:,.0f} rows/s), {t['admitted']:,} admitted, "
              f"{t['rejects']:,} rejects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
