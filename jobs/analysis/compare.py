"""`raygen report RUN --compare OTHER`: two runs side by side on the prompts they share.

    python -m jobs.analysis.report <run> [--config FILE] --compare <other run or its YAML>

What it is for: evaluating a drafter. A held-out sample is generated once with the new
drafter and once with the baseline (the same input, sampling and budget; only
engine.speculative differs), and the two runs are read side by side
(docs/compare-drafters.md).

Design decisions:
- The join is on the row's identity, (key, sample) (docs/rows-and-schema.md "Row keys";
  sample is null, read as 0, unless job.samples_per_prompt > 1), each run at its latest
  version per identity, as every figure of the report. The runs' sidecars hold salted
  digests (each run its own salt), so the keys are read from the data parts themselves
  (a few scalar columns of the latest rows, jobs.io.run_index.read_latest). A key both
  runs hold whose prompt_hash differs (a prompt edited under its id between the runs)
  is not a shared prompt: counted and left out. Rows present in one run only are
  counted, never silently dropped.
- Figures per side, overall and per category (the run's category), over the shared
  rows only: accept length (sum of output tokens / sum of verify steps over the rows
  that recorded verify counts, ``accept_length``: the report's one definition, never a
  mean of per-row ratios), the truncated fraction (finish_reason == "length"), mean
  output tokens, and request output tok/s (sum of output tokens / sum of the rows'
  latency_s, the seconds each spent in its replica, queueing and prefill included: it
  depends on the load each run ran at). Beside them each run's output tokens per
  GPU-hour as its progress.json records it (the whole run, start-up and idle included,
  not only the shared prompts), or a note that it was not recorded.
- What the rows cannot say is not estimated: a row records one verify count per version
  (cumulative over its continuations), so accept length by output position (the first
  1K tokens, 1K-4K, later) cannot be read from a run; the report has no such split.
- OTHER is named like the run itself: a run URI (reached with the run's storage
  settings: --config's, else the environment's), or a YAML config (a path ending in
  .yaml/.yml) naming <job.output>/<job.run_name>, its own storage section used.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

import pandas as pd
import pyarrow as pa

from jobs.analysis.numbers import rounded
from jobs.analysis.run_cli import open_run, require_run, run_uri
from jobs.io.run_index import RunIndex, read_latest
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA

COLUMNS = ["key", "sample", "prompt_hash", "category", "finish_reason", "completion_tokens",
           "spec_verify_ct", "latency_s"]
IDENTITY = ["key", "sample"]
SIDES = ("run", "other")
CONFIG_SUFFIXES = (".yaml", ".yml")


class CompareError(ValueError):
    """Two runs that cannot be compared (one line naming both)."""


def accept_length(tokens: pd.Series, verify: pd.Series) -> Optional[float]:
    """Output tokens per verify step over the rows that recorded verify counts (sum over
    sum; None when none did: no speculative decoding)."""
    tokens, verify = tokens.astype(float), verify.astype(float)
    has = verify.notna() & (verify > 0) & tokens.notna()
    return rounded(tokens[has].sum() / verify[has].sum()) if has.any() else None


def open_other(ref: str, config_path: Optional[str]) -> RunStore:
    """The run --compare names: a YAML config (its run and storage) or a run URI (with
    the storage settings the main run was opened with). Exits 1 (naming it) when no run
    is there."""
    if ref.endswith(CONFIG_SUFFIXES):
        store = open_run(run_uri(argparse.Namespace(run=None, config=ref)), ref)
    else:
        store = open_run(ref, config_path)
    require_run(store, what="--compare")
    return store


def keyed_latest(store: RunStore) -> pd.DataFrame:
    """COLUMNS of every identity's latest row, read from the run's data parts."""
    index = RunIndex.open(store)
    tables = [t for _, t, _ in read_latest(store, index, COLUMNS) if t.num_rows]
    table = pa.concat_tables(tables) if tables else pa.schema(
        [DATA.field(c) for c in COLUMNS]).empty_table()
    df = table.to_pandas()
    df["sample"] = df["sample"].fillna(0).astype("int64")
    df["category"] = df["category"].fillna("none").astype(str)
    return df


def side_stats(df: pd.DataFrame) -> dict[str, Any]:
    """One run's figures over a set of its rows."""
    n = len(df)
    ct = df["completion_tokens"].astype(float)
    latency = df["latency_s"].astype(float)
    timed = latency.notna() & (latency > 0) & ct.notna()
    spec = df["spec_verify_ct"].astype(float)
    return {
        "accept_length": accept_length(ct, spec),
        "rows_with_verify_counts": int((spec.notna() & (spec > 0)).sum()),
        "truncated": int((df["finish_reason"] == "length").sum()),
        "truncated_fraction": rounded((df["finish_reason"] == "length").mean()) if n else None,
        "mean_output_tokens": rounded(ct.mean(), 2) if n else None,
        "request_output_tok_per_s": (rounded(ct[timed].sum() / latency[timed].sum(), 2)
                                     if timed.any() else None),
    }


def pair_stats(run: pd.DataFrame, other: pd.DataFrame) -> dict[str, Any]:
    """Both runs' figures over the same shared prompts, and the accept length ratio."""
    a, b = side_stats(run), side_stats(other)
    ratio = (rounded(a["accept_length"] / b["accept_length"], 3)
             if a["accept_length"] and b["accept_length"] else None)
    return {"rows": len(run), "run": a, "other": b, "accept_length_ratio": ratio}


def throughput(store: RunStore) -> dict[str, Any]:
    """The run's output tokens per GPU-hour (and per GPU-second) as its progress.json
    recorded them: the whole run over its sessions (jobs/analysis/gpu_hours.py)."""
    progress = store.read_json("progress.json") or {}
    g = progress.get("gpu_hours") if isinstance(progress.get("gpu_hours"), dict) else {}
    rate = rounded(g.get("output_tok_per_gpu_h"), 1)
    return {"unit": g.get("unit"), "output_tok_per_gpu_h": rate,
            "output_tok_per_s_per_gpu": rounded(rate / 3600.0, 2) if rate else None}


def compare_frames(run: pd.DataFrame, other: pd.DataFrame, uri: str,
                   other_uri: str) -> dict[str, Any]:
    """report.json's "compare" section from both runs' keyed latest rows."""
    if other.empty:
        raise CompareError(f"--compare: run {other_uri} has no completed rows yet: "
                           f"nothing to compare")
    both = run.merge(other, on=IDENTITY, how="outer", suffixes=("_run", "_other"),
                     indicator=True)
    in_both = both["_merge"] == "both"
    hashes = both["prompt_hash_run"], both["prompt_hash_other"]
    differs = in_both & hashes[0].notna() & hashes[1].notna() & (hashes[0] != hashes[1])
    shared = both[in_both & ~differs]
    if shared.empty:
        raise CompareError(
            f"runs {uri} ({len(run):,} prompts) and {other_uri} ({len(other):,} "
            f"prompts) share no prompts (joined on key and sample"
            + (f"; {int(differs.sum()):,} with the same key but another prompt in each"
               if differs.any() else "") + "): compare runs generated from the same input")

    def of(rows: pd.DataFrame, side: str) -> pd.DataFrame:
        return rows[[c + "_" + side for c in COLUMNS if c not in IDENTITY]].rename(
            columns=lambda c: c.removesuffix("_" + side))

    # by the report's run's category, the largest first
    groups = sorted(shared.groupby("category_run", sort=True), key=lambda kv: -len(kv[1]))
    return {
        "run": uri, "other": other_uri, "joined_on": list(IDENTITY),
        "shared": len(shared),
        "only_in_run": int((both["_merge"] == "left_only").sum()),
        "only_in_other": int((both["_merge"] == "right_only").sum()),
        "prompt_differs": int(differs.sum()),
        "overall": pair_stats(of(shared, "run"), of(shared, "other")),
        "by_category": {str(c): pair_stats(of(g, "run"), of(g, "other")) for c, g in groups},
    }


def compare_runs(store: RunStore, other: RunStore) -> dict[str, Any]:
    """The "compare" section: ``store`` (the report's run) and ``other`` side by side."""
    section = compare_frames(keyed_latest(store), keyed_latest(other), store.uri, other.uri)
    section["throughput"] = {"run": throughput(store), "other": throughput(other)}
    return section
