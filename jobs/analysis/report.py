"""End-of-run report: what the run's files say about its outputs, and what a cap change would do.

    python -m jobs.analysis.report <run> [--config FILE] [--what-if 5120,6144,8192,16384]
                                   [--trainer-max-length 2048,4096] [--compare OTHER]

Design decisions:
- Every figure is computed over the latest version per key, the row's current state:
  a continued row counts once, with its cumulative tokens and last finish reason.
  The run index (jobs/io/run_index.py) says which row that is; the report's columns of
  those rows come from the parts' sidecars (format 4 keeps them per row,
  jobs/io/part_summary.py), read in parallel, so the report reads no data part; a part
  whose sidecar predates format 4 is read for those few scalar columns instead, never
  token ids or text. Memory holds one row per key, not every version.
- The same summary is computed overall, per category and per prompt-length bin by
  one function (group_stats), so the three tables can never disagree in definition.
- "Truncated" means finish_reason == "length" (cut at the row's budget); split into
  cut while thinking (no </think> yet: no answer at all) and cut in the answer, also
  per thinking budget the rows ran under (jobs.analysis.thinking_budget).
  Failures count only open ones (keys in failures/ without a row in data/).
- The what-if section is jobs.analysis.forecast: truncated rows are censored observations, so
  the fraction at another cap is a model estimate with a range; extrapolations above
  the observed cap are marked as such.
- --trainer-max-length N: per category, the output tokens a drafter trainer at max
  length N trains on and cuts, and the GPU time they cost; the what-if in trainable
  tokens too (jobs.analysis.token_yield).
- GPU-hours (jobs.analysis.gpu_hours): what the run's replicas held over all its
  sessions, the rate (output tokens per GPU-hour) and the forecast for the rows left,
  as the last progress.json recorded them (the files cannot say what engines held), with
  the cost at job.price_per_gpu_hour; the what-if prices each cap at that rate (per
  1,000 rows, and continuing this run's truncated rows to it). The thinking-budget and
  trainable-token sections give busy GPU time from the rows' own latency (token_yield).
- --compare OTHER: this run and another side by side on the prompts both hold (accept
  length, truncation, output tok/s; overall and per category): jobs.analysis.compare,
  report.json's "compare" section. Accept length is given overall, per category and per
  sampling setting (one definition, compare.accept_length); not by output position:
  a row records one verify count per version, so the rows cannot say it.
- Files go to the run prefix (report.json, report.md, report_lengths.png) with atomic
  writes, so a report is either the old one or the new one, never half of each.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import io
import math
import sys
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from jobs.analysis import compare, gpu_hours
from jobs.analysis.forecast import forecast_report
from jobs.analysis.numbers import rounded
from jobs.analysis.run_cli import add_run_args, fail, open_args, require_run
from jobs.analysis.thinking_budget import budgets_md, in_effect, thinking_budgets
from jobs.analysis.token_yield import clock_of, parse_lengths, yield_report
from jobs.io.digests import sorted_contains
from jobs.io.samples import identity_digests
from jobs.io.part_summary import reject_reason_class
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA
from jobs.io.storage import write_bytes_atomic, write_json_atomic

DEGENERATE_REPETITION = 0.5   # share of repeated 4-grams above which an output is a loop
PROMPT_BINS = [(0, 256, "<256"), (256, 1024, "256-1K"), (1024, 4096, "1K-4K"),
               (4096, math.inf, ">=4K")]
MD_MAX_CATEGORIES = 30        # markdown table rows; report.json keeps every category
# Every one is in a format-4 sidecar (part_summary.STATS_COLUMNS + its own; a test keeps
# it so): a column added here needs a new sidecar format, or the report reads parts.
REPORT_COLUMNS = [
    "version", "category", "finish_reason", "finished_thinking", "prompt_tokens",
    "completion_tokens", "reasoning_tokens", "max_new_tokens", "effective_max_new_tokens",
    "budget_clamped_by", "continuations", "spec_verify_ct", "repetition_ratio",
    "settings_hash", "created_at", "latency_s", "replica", "max_thinking_tokens",
    "integrity_flags", "setting"]
FLAGGED_KEYS_LISTED = 100     # report.json names this many flagged latest rows by key


# --- figures ----------------------------------------------------------------------------

def load_latest(store: RunStore,
                index: Optional[RunIndex] = None) -> tuple[pd.DataFrame, RunIndex]:
    """(one row per key with its latest version, the run index it was read through).
    ``index``: the run's index when the caller holds one (refreshed here)."""
    if index is None:
        index = RunIndex(store)
    index.refresh()
    # held: the session's end writes the compact stats object from this same read
    tables, flagged_at = [], []
    for path, rows, table in index.latest_stats(REPORT_COLUMNS, hold=True):
        tables.append(table)
        lengths = pc.list_value_length(table.column("integrity_flags")).to_numpy(
            zero_copy_only=False)
        flagged_at += [(path, int(rows[i])) for i in np.flatnonzero(np.nan_to_num(lengths) > 0)]
    table = pa.concat_tables(tables) if tables else pa.schema(
        [DATA.field(c) for c in REPORT_COLUMNS]).empty_table()
    df = table.to_pandas()
    df["category"] = df["category"].fillna("none").astype(str)
    df.attrs["flagged_at"] = flagged_at  # (part, row) of the flagged rows: their keys
    return df, index


def flagged_stats(store: RunStore, df: pd.DataFrame) -> dict[str, Any]:
    """The latest rows that carry integrity flags (export leaves them out): by flag and
    category, and the first FLAGGED_KEYS_LISTED by key with their version (how many
    times the key was generated or continued before) and replica, read from their parts'
    key column only. Rows whose part predates the column are "not recorded"."""
    flags = df["integrity_flags"]
    recorded = flags.notna()
    hit = recorded & flags.map(lambda f: f is not None and len(f) > 0)
    by_flag = collections.Counter(f for fs in flags[hit] for f in fs)
    keys = []
    by_part: dict[str, list[int]] = collections.defaultdict(list)
    for path, row in df.attrs.get("flagged_at", [])[:FLAGGED_KEYS_LISTED]:
        by_part[path].append(row)
    for path, rows in by_part.items():
        t = store.read_part(path, ["key", "version", "replica", "integrity_flags"])
        if t.num_rows:
            keys += t.take(pa.array(rows)).to_pylist()
    keys.sort(key=lambda r: r["key"])
    return {"rows": int(hit.sum()), "not_recorded": int((~recorded).sum()),
            "by_flag": dict(by_flag.most_common()),
            "by_category": {str(k): int(v) for k, v in
                            df.loc[hit, "category"].value_counts().items()},
            "keys": [{"key": r["key"], "version": r["version"], "replica": r["replica"],
                      "flags": list(r["integrity_flags"] or [])} for r in keys]}


def length_stats(tokens: pd.Series) -> dict[str, Any]:
    t = tokens.astype(float)
    if t.empty:
        return {k: None for k in ("mean", "median", "p90", "p99", "max", "total")}
    return {"mean": rounded(t.mean()), "median": rounded(t.median()), "p90": rounded(t.quantile(0.9)),
            "p99": rounded(t.quantile(0.99)), "max": int(t.max()), "total": int(t.sum())}


def group_stats(df: pd.DataFrame) -> dict[str, Any]:
    """The summary of one set of rows (overall, a category or a prompt bin)."""
    n = len(df)
    finish = df["finish_reason"].fillna("unknown")
    counts = finish.value_counts()
    cut = finish == "length"
    done_thinking = df["finished_thinking"].fillna(False).astype(bool)
    ct = df["completion_tokens"].astype(float)
    pct = (lambda c: rounded(100.0 * c / n)) if n else (lambda c: None)
    return {
        "rows": n,
        "output_tokens": length_stats(df["completion_tokens"]),
        "finish_reasons": {str(r): {"rows": int(c), "pct": pct(c)} for r, c in counts.items()},
        "truncated": int(cut.sum()), "truncated_pct": pct(cut.sum()),
        "clean_stop_pct": pct((finish == "stop").sum()),
        "mean_reasoning_tokens": rounded(df["reasoning_tokens"].astype(float).mean(), 2),
        "mean_answer_tokens": rounded((ct - df["reasoning_tokens"].astype(float)).mean(), 2),
        "truncated_while_thinking": int((cut & ~done_thinking).sum()),
        "truncated_in_answer": int((cut & done_thinking).sum()),
        "degenerate": int((df["repetition_ratio"].astype(float) > DEGENERATE_REPETITION).sum()),
        "accept_length": compare.accept_length(ct, df["spec_verify_ct"]),
        "continued_rows": int((df["continuations"].fillna(0) > 0).sum()),
        "continuations": int(df["continuations"].fillna(0).sum()),
    }


def prompt_bin(prompt_tokens: pd.Series) -> pd.Series:
    edges = [lo for lo, _, _ in PROMPT_BINS] + [math.inf]
    labels = [label for _, _, label in PROMPT_BINS]
    return pd.cut(prompt_tokens.fillna(0).astype(float), edges, right=False, labels=labels)


def breakdown(df: pd.DataFrame, by: pd.Series, order: Optional[list] = None) -> dict:
    names = order if order is not None else sorted(by.dropna().unique(), key=str)
    return {str(name): group_stats(df[by == name]) for name in names
            if (by == name).any()}


def _budgets(df: pd.DataFrame) -> dict[str, Any]:
    caps = df["max_new_tokens"].dropna().astype(int).value_counts().sort_index()
    clamped = df["budget_clamped_by"].fillna("")
    return {
        "caps": [{"max_new_tokens": int(c), "rows": int(n)} for c, n in caps.items()],
        "clamped": {str(k): int(v) for k, v in clamped[clamped != ""].value_counts().items()},
        "settings_hashes": {str(k): int(v)
                            for k, v in df["settings_hash"].value_counts().items()},
    }


def failure_stats(store: RunStore, done: np.ndarray) -> dict[str, Any]:
    """Open failures (no data row for the key) by error class, one per key (its latest;
    per (key, sample) with samples). done: sorted digests of the keys with a data row
    (the run index's, salted: identity digests, jobs/io/samples.py)."""
    f = store.read_kind("failures", ["key", "error_class", "failed_at", "sample"]).to_pandas()
    f["sample"] = f["sample"].fillna(0).astype("int64")
    open_rows = ~sorted_contains(done, identity_digests(f["key"], f["sample"],
                                                        store.key_salt))[0]
    f = f[open_rows].sort_values(["key", "sample", "failed_at"], kind="stable")
    f = f.drop_duplicates(["key", "sample"], keep="last")
    by = f["error_class"].fillna("unknown").value_counts()
    return {"open": len(f), "by_error_class": {str(k): int(v) for k, v in by.items()}}


def reject_stats(store: RunStore) -> dict[str, Any]:
    """Rejected input rows (one per source line) by reason class, with an example each."""
    r = store.read_kind("rejects", ["source", "line", "reason"]).to_pandas()
    r = r.drop_duplicates(["source", "line"], keep="last")
    r["class"] = r["reason"].fillna("").map(reject_reason_class)
    out = {}
    for name, group in r.groupby("class", sort=True):
        out[str(name)] = {"rows": len(group), "example": str(group["reason"].iloc[0])[:200]}
    return {"total": len(r), "by_reason": out}


def build_report(store: RunStore, caps: Optional[Sequence[int]] = None,
                 trainer_max_lengths: Sequence[int] = ()) -> dict[str, Any]:
    """Every figure of the report as a JSON-safe dict (see the module docstring)."""
    df, index = load_latest(store)
    return assemble(store, df, index, caps, trainer_max_lengths)


def assemble(store: RunStore, df: pd.DataFrame, index: RunIndex,
             caps: Optional[Sequence[int]] = None,
             trainer_max_lengths: Sequence[int] = ()) -> dict[str, Any]:
    progress = store.read_json("progress.json") or {}
    lengths = list(trainer_max_lengths or ())
    gpu = gpu_section(progress)
    fc = forecast_report(df, caps, trainer_max_lengths=lengths,
                         tokens_per_gpu_h=gpu["output_tok_per_gpu_h"], gpu_unit=gpu["unit"],
                         price=gpu["price_per_gpu_h"])
    clock = clock_of(df, gpu_hours.engine_weight(gpu["gpus_per_engine"]))
    return {
        "run": store.uri,
        "generated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "status": progress.get("status"),
        "keys": len(df), "data_rows_all_versions": index.data_rows,
        "degenerate_threshold": DEGENERATE_REPETITION,
        "budgets": _budgets(df), "current_cap": fc["current_cap"],
        "gpu_hours": gpu,
        "thinking_budgets": thinking_budgets(df, clock),
        "overall": group_stats(df),
        "by_category": breakdown(df, df["category"]),
        "by_setting": breakdown(df, df["setting"]),  # a sampling mix's; {} with one setting
        "by_prompt_bin": breakdown(df, prompt_bin(df["prompt_tokens"]).astype(object),
                                   [label for _, _, label in PROMPT_BINS]),
        "failures": failure_stats(store, index.done),
        "flagged": flagged_stats(store, df),
        "rejects": reject_stats(store),
        "forecast": fc,
        "token_yield": yield_report(df, lengths, clock) if lengths else None,
    }


GPU_FIELDS = ("unit", "gpus_per_engine", "spent", "sessions", "output_tokens",
              "output_tok_per_gpu_h", "forecast_rows_left", "price_per_gpu_h", "cost_spent",
              "cost_forecast_rows_left")


def gpu_section(progress: dict[str, Any]) -> dict[str, Any]:
    """report.json's gpu_hours: progress.json's (the run's total over its sessions), with
    GPU-hours per 1B output tokens; every field null when no session recorded them."""
    g = progress.get("gpu_hours") if isinstance(progress.get("gpu_hours"), dict) else {}
    out = {k: g.get(k) for k in GPU_FIELDS}
    out["unit"] = out["unit"] or gpu_hours.GPU_UNIT
    out["recorded"] = bool(g)
    out["rows_left"] = progress.get("remaining")
    rate = out["output_tok_per_gpu_h"]
    out["gpu_hours_per_1b_output_tokens"] = rounded(1e9 / rate, 2) if rate else None
    return out


# --- rendering --------------------------------------------------------------------------

def _fmt(x: Any, nd: int = 1, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, (int, np.integer)):
        return f"{x:,}{suffix}"
    return f"{x:,.{nd}f}{suffix}"


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


LABELS = {"stop": "stop", "length": "length (truncated)", "abort": "abort"}
GROUP_HEADERS = ["", "rows", "mean", "median", "p90", "p99", "max", "truncated %", "stop %",
                 "cut thinking", "cut answer", "degenerate", "accept len", "continued"]


def _group_row(name: str, g: dict[str, Any]) -> list[str]:
    o = g["output_tokens"]
    return [name, _fmt(g["rows"]), _fmt(o["mean"]), _fmt(o["median"]), _fmt(o["p90"]),
            _fmt(o["p99"]), _fmt(o["max"]), _fmt(g["truncated_pct"], 1, "%"),
            _fmt(g["clean_stop_pct"], 1, "%"), _fmt(g["truncated_while_thinking"]),
            _fmt(g["truncated_in_answer"]), _fmt(g["degenerate"]),
            _fmt(g["accept_length"], 2), _fmt(g["continued_rows"])]


def _forecast_md(fc: dict[str, Any]) -> list[str]:
    lines = [f"## What-if: other caps (current cap {fc['current_cap']})", ""]
    if not fc["rows"]:
        return lines + [f"- {n}" for n in fc["notes"]] + [""]
    unit = fc.get("gpu_unit") or gpu_hours.GPU_UNIT
    priced = fc.get("price_per_gpu_h") is not None
    rows = []
    for r in fc["rows"]:
        rows.append([
            f"{r['cap']:,}", _share(r["truncated_fraction"], r["truncated_lo"],
                                    r["truncated_hi"]),
            _share(r["km_truncated_fraction"], r["km_lo"], r["km_hi"]),
            f"{_fmt(r['mean_tokens'], 0)} ({_fmt(r['mean_tokens_lo'], 0)}-"
            f"{_fmt(r['mean_tokens_hi'], 0)})", _fmt(r["relative_gpu_time"], 2, "x"),
            _hours(r.get("gpu_hours_per_1k_rows")), _continue_cell(r, priced),
            "extrapolated" if r["extrapolated"] else "observed range"])
    lines += _table(["cap", "truncated % (90% range)", "Kaplan-Meier %",
                     "mean output tok (range)", "GPU time vs now", f"{unit} / 1K rows",
                     f"raise the cap to it: +{unit} (range)" + (", cost" if priced else ""),
                     ""], rows)
    if not fc.get("output_tok_per_gpu_h"):
        lines.append(f"- {unit} columns: no rate measured (progress.json records no "
                     f"gpu_hours for this run).")
    return lines + [f"- {n}" for n in fc["notes"]] + [""]


def _continue_cell(r: dict[str, Any], priced: bool) -> str:
    """'+1.2 (1.1-1.4)' GPU-hours of continuing the run's truncated rows to this cap."""
    hours = r.get("continue_gpu_hours")
    if hours is None:
        return "-"
    lo, hi = r.get("continue_gpu_hours_lo"), r.get("continue_gpu_hours_hi")
    cell = f"+{_hours(hours)}" + (f" ({_hours(lo)}-{_hours(hi)})" if lo is not None
                                   and hi is not None else "")
    return cell + (f", {gpu_hours.fmt_money(r.get('continue_cost'))}" if priced else "")


def _gpu_md(g: dict[str, Any]) -> list[str]:
    lines = ["## GPU-hours", ""]
    if not g.get("recorded"):
        return lines + ["Not recorded: the run's progress.json has no gpu_hours (its sessions "
                        "ran under a raygen that did not count them).", ""]
    u = g["unit"]
    what = ("GPUs held by the run's replicas x wall time" if u == gpu_hours.GPU_UNIT else
            "replicas without a GPU (CPU engine, simulator), each counted as one engine")
    lines.append(f"- Spent: {_hours(g['spent'])} {u} over {g['sessions'] or '?'} session(s) "
                 f"({what}; start-up, ramp and idle included), for "
                 f"{_fmt(g['output_tokens'])} output tokens the run gained: "
                 f"{gpu_hours.fmt_rate(g['output_tok_per_gpu_h'])} output tok/{u}, "
                 f"{_fmt(g['gpu_hours_per_1b_output_tokens'], 1)} {u} per 1B output tokens.")
    if g.get("rows_left"):
        lines.append(f"- Rows left: {g['rows_left']:,}, ~{_hours(g['forecast_rows_left'])} {u} "
                     f"at the rate measured.")
    if g.get("price_per_gpu_h") is not None:
        lines.append(f"- Cost at {gpu_hours.fmt_money(g['price_per_gpu_h'])} per {u}: "
                     f"{gpu_hours.fmt_money(g['cost_spent'])} spent"
                     + (f", ~{gpu_hours.fmt_money(g['cost_forecast_rows_left'])} for the rows "
                        f"left" if g.get("rows_left") else "") + ".")
    return lines + [""]


def _pct(x: Optional[float]) -> str:
    """A fraction as a percentage with enough digits for small tails."""
    if x is None:
        return "-"
    p = 100.0 * x
    if p == 0 or p >= 1:
        return f"{p:.1f}"
    return f"{p:.2f}" if p >= 0.01 else "<0.01"


def _share(x: Optional[float], lo: Optional[float], hi: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{_pct(x)}%" + (f" ({_pct(lo)}-{_pct(hi)})" if lo is not None else "")


def render_markdown(rep: dict[str, Any]) -> str:
    o = rep["overall"]
    caps = ", ".join(f"{c['max_new_tokens']:,} ({c['rows']:,} rows)"
                     for c in rep["budgets"]["caps"]) or "-"
    lines = [f"# Run report: {rep['run']}", "",
             f"Generated {rep['generated_at']}; run status: {rep['status'] or 'unknown'}. "
             f"{rep['keys']:,} prompts with a result ({rep['data_rows_all_versions']:,} data "
             f"rows incl. earlier versions). Budget (max_new_tokens): {caps}. Thinking "
             f"budget (max_thinking_tokens): {in_effect(rep.get('thinking_budgets') or [])}.", "",
             "## Overall", ""]
    lines += _table(GROUP_HEADERS, [_group_row("all", o)])
    lines += _table(["finish reason", "rows", "%"],
                    [[k, _fmt(v["rows"]), _fmt(v["pct"], 1, "%")]
                     for k, v in o["finish_reasons"].items()])
    lines += [f"- Mean reasoning tokens {_fmt(o['mean_reasoning_tokens'])}, mean answer tokens "
              f"{_fmt(o['mean_answer_tokens'])}.",
              f"- Truncated {_fmt(o['truncated'])}: {_fmt(o['truncated_while_thinking'])} while "
              f"thinking (no answer), {_fmt(o['truncated_in_answer'])} in the answer.",
              f"- Degenerate (repetition ratio > {rep['degenerate_threshold']}): "
              f"{_fmt(o['degenerate'])}. Accept length: {_fmt(o['accept_length'], 2)}. "
              f"Continued rows: {_fmt(o['continued_rows'])} ({_fmt(o['continuations'])} "
              f"continuations).", ""]
    lines += _gpu_md(rep.get("gpu_hours") or {})
    cats = sorted(rep["by_category"].items(), key=lambda kv: -kv[1]["rows"])
    lines += ["## By category", ""]
    lines += _table(GROUP_HEADERS, [_group_row(k, g) for k, g in cats[:MD_MAX_CATEGORIES]])
    if len(cats) > MD_MAX_CATEGORIES:
        lines += [f"({len(cats) - MD_MAX_CATEGORIES} smaller categories in report.json)", ""]
    if rep.get("by_setting"):
        lines += ["## By sampling setting (job.sampling mix)", ""]
        lines += _table(GROUP_HEADERS, [_group_row(k, g) for k, g in rep["by_setting"].items()])
    lines += ["## By prompt length (tokens)", ""]
    lines += _table(GROUP_HEADERS, [_group_row(k, g) for k, g in rep["by_prompt_bin"].items()])
    lines += budgets_md(rep.get("thinking_budgets") or [])
    lines += _problems_md(rep) + _yield_md(rep.get("token_yield"))
    lines += _forecast_md(rep["forecast"]) + _trainable_forecast_md(rep["forecast"])
    lines += _compare_md(rep.get("compare"))
    return "\n".join(lines)


COMPARE_HEADERS = ["", "shared rows", "accept len (this / other)", "accept len ratio",
                   "truncated % (this / other)", "mean output tok (this / other)",
                   "request tok/s (this / other)"]


def _pair(g: dict[str, Any], field: str, nd: int, scale: float = 1.0) -> str:
    a, b = (g[side][field] for side in compare.SIDES)
    return " / ".join(_fmt(None if x is None else x * scale, nd) for x in (a, b))


def _compare_row(name: str, g: dict[str, Any]) -> list[str]:
    return [name, _fmt(g["rows"]), _pair(g, "accept_length", 2),
            _fmt(g["accept_length_ratio"], 3, "x"), _pair(g, "truncated_fraction", 1, 100.0),
            _pair(g, "mean_output_tokens", 1), _pair(g, "request_output_tok_per_s", 1)]


def _compare_md(c: Optional[dict[str, Any]]) -> list[str]:
    """The --compare section: this run and OTHER on the prompts both hold."""
    if not c:
        return []
    cats = list(c["by_category"].items())
    lines = [f"## Compared with {c['other']} (the prompts both runs hold)", "",
             f"{c['shared']:,} prompts in both runs (joined on key and sample, the latest "
             f"version of each); {c['only_in_run']:,} only in this run and "
             f"{c['only_in_other']:,} only in the other, left out"
             + (f"; {c['prompt_differs']:,} with the same key but another prompt in each "
                f"run, left out" if c["prompt_differs"] else "") + ".", ""]
    lines += _table(COMPARE_HEADERS, [_compare_row("all", c["overall"])]
                    + [_compare_row(k, g) for k, g in cats[:MD_MAX_CATEGORIES]])
    if len(cats) > MD_MAX_CATEGORIES:
        lines += [f"({len(cats) - MD_MAX_CATEGORIES} smaller categories in report.json)", ""]
    rates = [c["throughput"][side] for side in compare.SIDES]
    if all(r["output_tok_per_s_per_gpu"] for r in rates):
        engines = any(r["unit"] == gpu_hours.ENGINE_UNIT for r in rates)
        lines.append("- Output tok/s per GPU over the whole run (progress.json's output tokens "
                     "per GPU-hour / 3,600: start-up and idle included, every prompt of the "
                     f"run): this run {_fmt(rates[0]['output_tok_per_s_per_gpu'], 1)}, the "
                     f"other {_fmt(rates[1]['output_tok_per_s_per_gpu'], 1)}"
                     + (" (engine-h: per engine, a replica without a GPU)" if engines else "")
                     + ".")
    else:
        missing = [name for name, r in zip(("this run", "the other"), rates)
                   if not r["output_tok_per_s_per_gpu"]]
        lines.append(f"- Output tok/s per GPU: not recorded for {' and '.join(missing)} "
                     f"(progress.json has no gpu_hours); request tok/s above is the rows' own.")
    return lines + [
        "- Accept length: output tokens / verify steps, summed over the rows that recorded "
        "verify counts (- : none did, no speculative decoding). Request tok/s: output "
        "tokens / seconds in the replica (queueing and prefill included), summed: it "
        "depends on the load each run ran at.", ""]


YIELD_HEADERS = ["", "rows", "output tok", "trainable tok", "trainable %", "cut tok",
                 "rows cut", "rows w/o trainable", "GPU-h", "cut GPU-h", "cut GPU %"]


def _yield_row(name: str, g: dict[str, Any]) -> list[str]:
    return [name, _fmt(g["rows"]), _fmt(g["output_tokens"]), _fmt(g["trainable_tokens"]),
            _fmt(g["trainable_pct"], 1, "%"), _fmt(g["cut_tokens"]), _fmt(g["rows_cut"]),
            _fmt(g["rows_without_trainable"]), _hours(g["gpu_hours"]),
            _hours(g["cut_gpu_hours"]), _fmt(g["cut_gpu_pct"], 1, "%")]


def _hours(x: Optional[float]) -> str:
    """GPU-hours with three significant digits (a small run's are fractions of one)."""
    return "-" if x is None else f"{x:,.3g}" if x < 1000 else f"{x:,.0f}"


def _tokens_range(x: Optional[float], lo: Optional[float], hi: Optional[float]) -> str:
    """'1,635' when the figure is exact (every length known), else with its range."""
    if lo is None or hi is None or round(lo) == round(hi):
        return _fmt(x, 0)
    return f"{_fmt(x, 0)} ({_fmt(lo, 0)}-{_fmt(hi, 0)})"


def _yield_md(ty: Optional[dict[str, Any]]) -> list[str]:
    if not ty:
        return []
    lines: list[str] = []
    for n, section in ty["by_max_length"].items():
        cats = sorted(section["by_category"].items(), key=lambda kv: -kv[1]["rows"])
        lines += [f"## Trainable tokens at trainer max length {int(n):,}", ""]
        lines += _table(YIELD_HEADERS, [_yield_row("all", section["overall"])]
                        + [_yield_row(k, g) for k, g in cats[:MD_MAX_CATEGORIES]])
    clock = ty["gpu_clock"]
    if clock:
        lines.append(f"- GPU clock: {clock['mean_requests_in_flight']:,.2f} requests in "
                     f"flight per replica on average over {_hours(clock['busy_replica_hours'])} "
                     f"busy replica-hours ({clock['replicas']} replicas, "
                     f"{clock['measured_rows']:,} first-version rows).")
    return lines + [f"- {note}" for note in ty["notes"]] + [""]


def _trainable_forecast_md(fc: dict[str, Any]) -> list[str]:
    rows = [r for r in fc["rows"] if r.get("trainable")]
    if not rows:
        return []
    lines: list[str] = []
    for n in rows[0]["trainable"]:
        table = []
        for r in rows:
            t = r["trainable"][n]
            done = None if r["truncated_fraction"] is None else 1 - r["truncated_fraction"]
            table.append([
                f"{r['cap']:,}", _share(done, None, None),
                _tokens_range(t["mean_trainable_tokens"], t["mean_trainable_tokens_lo"],
                              t["mean_trainable_tokens_hi"]),
                _tokens_range(t["mean_trainable_tokens_finished"],
                              t["mean_trainable_tokens_finished_lo"],
                              t["mean_trainable_tokens_finished_hi"]),
                _fmt(t["relative_trainable_finished"], 2, "x"),
                _fmt(r["relative_gpu_time"], 2, "x"), _hours(r.get("gpu_hours_per_1k_rows")),
                "extrapolated" if r["extrapolated"] else "observed range"])
        lines += [f"## What-if in trainable tokens (trainer max length {int(n):,})", ""]
        lines += _table(["cap", "finished %", "trainable tok/row, all rows (range)",
                         "trainable tok/row, finished rows (range)",
                         "trainable (finished) vs now", "GPU time vs now",
                         f"{fc.get('gpu_unit') or gpu_hours.GPU_UNIT} / 1K rows", ""], table)
    return lines


def _problems_md(rep: dict[str, Any]) -> list[str]:
    f, r = rep["failures"], rep["rejects"]
    lines = [f"## Failures ({f['open']:,} open) and rejects ({r['total']:,})", ""]
    flagged = rep.get("flagged") or {}
    if flagged.get("rows"):
        named = ", ".join(f"{k} {v}" for k, v in flagged["by_flag"].items())
        lines += [f"{flagged['rows']:,} latest rows carry integrity flags ({named}); export "
                  f"leaves them out. `raygen generate --config FILE --regenerate-flagged` "
                  f"generates them again as new versions.", ""]
        lines += _table(["key", "version", "replica", "flags"],
                        [[k["key"].replace("|", "/"), _fmt(k["version"]), k["replica"] or "-",
                          ", ".join(k["flags"])] for k in flagged["keys"]])
    if flagged.get("not_recorded"):
        lines += [f"{flagged['not_recorded']:,} latest rows are in parts written before "
                  f"raygen recorded integrity flags: not counted.", ""]
    if f["by_error_class"]:
        lines += _table(["error class", "open failures"],
                        [[k, _fmt(v)] for k, v in f["by_error_class"].items()])
    if r["by_reason"]:
        lines += _table(["reject reason", "rows", "example"],
                        [[k, _fmt(v["rows"]), v["example"].replace("|", "/")]
                         for k, v in r["by_reason"].items()])
    return lines


def lengths_png(df: pd.DataFrame, caps: Sequence[int]) -> bytes:
    """Histogram of output lengths (latest versions) by finish reason, caps marked."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state (Agg)

    fig = Figure(figsize=(9, 4.5), dpi=110)
    ax = fig.add_subplot()
    if df.empty:
        ax.text(0.5, 0.5, "no rows yet", ha="center", transform=ax.transAxes)
    else:
        top = max(float(df["completion_tokens"].max()), *(float(c) for c in caps)) * 1.03
        # Bins end at the smallest cap (+0.5), so the truncated pile is its own bar.
        base = min(caps) if caps else top
        width = base / max(1, round(base / (top / 80)))
        bins = 0.5 + width * np.arange(-1, math.ceil(top / width) + 1)
        parts = [(r, df.loc[df["finish_reason"] == r, "completion_tokens"])
                 for r in ("stop", "length", "abort")]
        parts = [(r, x) for r, x in parts if len(x)]
        # One filled step outline per finish reason, stacked: ax.hist draws a patch per
        # bin and reason (~240), which made the plot most of the report's CPU.
        bottom = np.zeros(len(bins) - 1)
        for r, x in parts:
            top_edge = bottom + np.histogram(x, bins=bins)[0]
            ax.stairs(top_edge, bins, baseline=bottom, fill=True,
                      label=f"{LABELS[r]} ({len(x):,})")
            bottom = top_edge
        for cap in caps:
            ax.axvline(cap, color="crimson", linestyle="--", linewidth=1)
            ax.annotate(f"cap {cap:,}", (cap, 1), xycoords=("data", "axes fraction"),
                        ha="right", va="top", rotation=90, fontsize=8, color="crimson")
        cut = (df["finish_reason"] == "length").mean()
        ax.set_title(f"{len(df):,} rows, {100 * cut:.1f}% truncated at the cap")
        ax.legend()
    ax.set_xlabel("output tokens (completion_tokens, latest version)")
    ax.set_ylabel("rows")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_report(store: RunStore, report: dict[str, Any],
                 df: Optional[pd.DataFrame] = None) -> list[str]:
    """report.json, report.md, report_lengths.png into the run prefix; returns their URIs.

    df: the latest rows when the caller has them (saves reading data/ again).
    """
    df = load_latest(store)[0] if df is None else df
    caps = [c["max_new_tokens"] for c in report["budgets"]["caps"]]
    md = render_markdown(report)
    write_json_atomic(store.loc("report.json"), report)
    write_bytes_atomic(store.loc("report.md"), (md + "\n").encode())
    write_bytes_atomic(store.loc("report_lengths.png"), lengths_png(df, caps))
    return [store.loc(name).uri for name in ("report.json", "report.md", "report_lengths.png")]


def report_and_write(store: RunStore, caps: Optional[Sequence[int]] = None,
                     index: Optional[RunIndex] = None,
                     trainer_max_lengths: Sequence[int] = ()) -> dict[str, Any]:
    """Build and write the report (the job calls this at the end of every run, with the
    index its progress kept current)."""
    df, index = load_latest(store, index)
    report = assemble(store, df, index, caps, trainer_max_lengths)
    write_report(store, report, df)
    return report


def parse_caps(text: Optional[str]) -> Optional[list[int]]:
    if not text:
        return None
    try:
        caps = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--what-if expects token counts like 5120,6144,8192, got {text!r}") from None
    if not caps or min(caps) <= 0:
        raise argparse.ArgumentTypeError(f"--what-if caps must be positive, got {text!r}")
    return caps


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m jobs.analysis.report` and `raygen report`."""
    add_run_args(parser)
    parser.add_argument("--what-if", type=parse_caps, default=None, metavar="CAPS",
                        help="comma-separated caps to forecast, e.g. 5120,6144,8192,16384")
    parser.add_argument("--trainer-max-length", type=parse_lengths, default=None,
                        metavar="N[,N...]",
                        help="the drafter trainer's max length(s) in tokens (prompt + "
                             "output), e.g. 2048,4096: per category the output tokens it "
                             "trains on and cuts, their GPU time, and the what-if in "
                             "trainable tokens")
    parser.add_argument("--compare", default=None, metavar="OTHER",
                        help="another run to read side by side on the prompts both hold "
                             "(accept length, truncation, output tok/s; overall and per "
                             "category): its run URI (reached like the run's) or its YAML "
                             "config (FILE.yaml)")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.analysis.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    store = open_args(args)
    require_run(store)
    other = compare.open_other(args.compare, args.config) if args.compare else None
    df, index = load_latest(store)
    if df.empty:
        fail(f"run {store.uri} has no completed rows yet: nothing to report")
    try:  # before the report's figures: a refused comparison costs no forecast
        compared = compare.compare_runs(store, other) if other is not None else None
    except compare.CompareError as exc:
        fail(str(exc))
    report = assemble(store, df, index, args.what_if, args.trainer_max_length or ())
    if compared is not None:
        report["compare"] = compared
    print(render_markdown(report))
    for uri in write_report(store, report, df):
        print(f"wrote {uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
