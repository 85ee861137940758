"""Trainable-token yield: what a drafter trainer at its max length keeps of each row.

    python -m jobs.analysis.report RUN --trainer-max-length 2048,4096
    python -m jobs.analysis.export RUN ... --trainer-max-length 4096   (the export manifest)

Design decisions:
- A trainer (SpecForge, speculators) truncates prompt + output to its max length N: of a
  row with P prompt and T output tokens it trains on min(T, max(N - P, 0)) output tokens
  (loss mask 1) and cuts the rest; a prompt of N tokens or more leaves it nothing. The
  counts are the model's own ids (prompt_token_ids + output_token_ids), which is what a
  pretokenized export holds; a trainer that re-renders conversations may differ by a few
  template tokens (that is the round-trip check's business).
- GPU time: the engine decodes every running request at each step, so a row's share of
  its replica's time is its latency over the requests in flight with it. Little's law
  gives that count without per-step data: on each replica, the union of the rows'
  [created_at - latency_s, created_at] intervals is the time it was busy, and summed
  latency / busy time is the mean number in flight. A row then costs
  latency_s / in-flight replica-seconds, x the GPUs per replica the run's progress.json
  records (a replica without a GPU counts as one: engine-hours, jobs/analysis/gpu_hours.py),
  and its cut tokens cost their share of it. This is busy time: the run's GPU-hours held
  (progress.json) also count start-up and idle engines. Only first-version rows are used to measure the
  in-flight count (a continued row's latency spans sessions); the measured count then
  applies to every row. Prefill is left out (decode-bound), and the cut tail sits at the
  longest KV cache, so the cut tokens cost slightly more than shown.
- The what-if (jobs.analysis.forecast) gives per cap C the expected trainable tokens
  per row: min(L, C, N - P) (rows cut at C kept, as --include-truncated exports them)
  and min(L, N - P) if L <= C else 0 (finished rows only, the export's default). A row
  whose length is known at C (finished, or cut at or past C) counts exactly, with its
  own prompt; only a row cut below C takes the fitted lognormal of its category given
  that it ran past its cut. So prompt and output lengths keep whatever link they have
  in the run, and the ranges are the fit's bootstrap range over those tails.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from jobs.analysis.lognormal import parts_below
from jobs.analysis.numbers import rounded

# What the yield reads of a row (report: scalar columns) and what the GPU clock reads.
YIELD_COLUMNS = ["category", "prompt_tokens", "completion_tokens", "latency_s"]
CLOCK_COLUMNS = ["replica", "created_at", "latency_s", "continuations"]
PROMPT_POINTS = 256     # what-if: room (N - prompt) points per group of censored rows


def _hours(seconds: float) -> Optional[float]:
    """Hours to 4 significant digits (a small run's GPU time is a fraction of an hour)."""
    return float(f"{seconds / 3600:.4g}") if math.isfinite(seconds) else None


def parse_lengths(text: Optional[str]) -> Optional[list[int]]:
    """'2048,4096' -> [2048, 4096] (the --trainer-max-length value)."""
    if not text:
        return None
    try:
        lengths = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--trainer-max-length expects token counts like 2048,4096, got {text!r}") from None
    if not lengths or min(lengths) <= 0:
        raise argparse.ArgumentTypeError(
            f"--trainer-max-length must be positive, got {text!r}")
    return lengths


def parse_length(text: str) -> int:
    """One max length (export: the manifest describes one trainer)."""
    lengths = parse_lengths(text)
    if not lengths or len(lengths) != 1:
        raise argparse.ArgumentTypeError(
            f"--trainer-max-length takes one token count here, got {text!r}")
    return lengths[0]


def trainable(prompt: np.ndarray, output: np.ndarray, max_length: int) -> np.ndarray:
    """Output tokens a trainer at max_length trains on, per row."""
    room = np.maximum(max_length - np.asarray(prompt, dtype=np.int64), 0)
    return np.minimum(np.asarray(output, dtype=np.int64), room)


# --- the GPU clock --------------------------------------------------------------------

@dataclass(frozen=True)
class GpuClock:
    """Replica-seconds per latency-second, measured on the run's first-version rows."""

    busy_s: float        # replica-seconds with at least one request in flight
    latency_s: float     # the measured rows' summed latency
    rows: int
    replicas: int
    gpus_per_replica: float = 1.0  # jobs/analysis/gpu_hours.engine_weight of the run's

    @property
    def in_flight(self) -> float:
        return self.latency_s / self.busy_s

    def gpu_seconds(self, latency_s: np.ndarray | float) -> np.ndarray | float:
        return latency_s / self.in_flight * self.gpus_per_replica

    def to_json(self) -> dict[str, Any]:
        return {"measured_rows": self.rows, "replicas": self.replicas,
                "busy_replica_hours": _hours(self.busy_s),
                "gpus_per_replica": self.gpus_per_replica,
                "mean_requests_in_flight": rounded(self.in_flight, 2)}


def busy_seconds(replica: np.ndarray, end: np.ndarray, latency: np.ndarray) -> float:
    """Sum over replicas of the length of the union of their [end - latency, end]."""
    if not len(end):
        return 0.0
    df = pd.DataFrame({"r": replica, "s": end - latency, "e": end}).sort_values(
        ["r", "s"], kind="stable")
    reach = df.groupby("r", sort=False)["e"].cummax()
    prev = reach.groupby(df["r"], sort=False).shift()
    block = (prev.isna() | (df["s"] > prev)).cumsum()
    spans = df.groupby(block).agg(s=("s", "min"), e=("e", "max"))
    return float((spans["e"] - spans["s"]).sum())


def measure_clock(replica, created_at, latency, continuations) -> Optional[GpuClock]:
    """The clock from rows' replica, created_at (datetime64 or seconds), latency_s and
    continuations; None when no row carries them all."""
    replica = pd.Series(replica, dtype=object).reset_index(drop=True)
    when = pd.Series(created_at).reset_index(drop=True)
    if pd.api.types.is_datetime64_any_dtype(when):
        when = pd.Series(when.dt.tz_localize(None) if when.dt.tz is not None else when)
        end = (when - pd.Timestamp(0)).dt.total_seconds()
    else:
        end = pd.to_numeric(when, errors="coerce")
    lat = pd.to_numeric(pd.Series(latency).reset_index(drop=True), errors="coerce")
    cont = pd.to_numeric(pd.Series(continuations).reset_index(drop=True),
                         errors="coerce").fillna(0)
    ok = replica.notna() & end.notna() & lat.notna() & (lat > 0) & (cont == 0)
    if not ok.any():
        return None
    busy = busy_seconds(replica[ok].astype(str).to_numpy(), end[ok].to_numpy(float),
                        lat[ok].to_numpy(float))
    if busy <= 0:
        return None
    return GpuClock(busy, float(lat[ok].sum()), int(ok.sum()), int(replica[ok].nunique()))


def clock_of(df: pd.DataFrame, gpus_per_replica: float = 1.0) -> Optional[GpuClock]:
    """The clock of a run's rows; ``gpus_per_replica``: what one replica counts for
    (gpu_hours.engine_weight of the run's replicas)."""
    if not set(CLOCK_COLUMNS) <= set(df.columns):
        return None
    clock = measure_clock(df["replica"], df["created_at"], df["latency_s"], df["continuations"])
    if clock is None or gpus_per_replica == 1.0:
        return clock
    return GpuClock(clock.busy_s, clock.latency_s, clock.rows, clock.replicas, gpus_per_replica)


# --- the yield of a set of rows -------------------------------------------------------

def group_yield(prompt: np.ndarray, output: np.ndarray, latency: Optional[np.ndarray],
                max_length: int, clock: Optional[GpuClock]) -> dict[str, Any]:
    prompt, output = np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)
    keep = trainable(prompt, output, max_length)
    cut = output - keep
    total, kept = int(output.sum()), int(keep.sum())
    out: dict[str, Any] = {
        "rows": int(output.size), "rows_cut": int((cut > 0).sum()),
        "rows_without_trainable": int(((keep == 0) & (output > 0)).sum()),
        "output_tokens": total, "trainable_tokens": kept, "cut_tokens": total - kept,
        "trainable_pct": rounded(100.0 * kept / total, 2) if total else None,
        "mean_trainable_tokens": rounded(kept / output.size, 1) if output.size else None,
        "gpu_hours": None, "cut_gpu_hours": None, "cut_gpu_pct": None}
    if clock is None or latency is None:
        return out
    lat = np.nan_to_num(np.asarray(latency, dtype=float), nan=0.0)
    gpu = clock.gpu_seconds(lat)
    with np.errstate(invalid="ignore", divide="ignore"):
        cut_gpu = np.where(output > 0, gpu * cut / np.maximum(output, 1), 0.0)
    out["gpu_hours"] = _hours(gpu.sum())
    out["cut_gpu_hours"] = _hours(cut_gpu.sum())
    out["cut_gpu_pct"] = rounded(100.0 * cut_gpu.sum() / gpu.sum(), 2) if gpu.sum() > 0 else None
    return out


def yield_by_category(df: pd.DataFrame, max_length: int,
                      clock: Optional[GpuClock]) -> dict[str, Any]:
    """{overall, by_category} for rows with category, prompt_tokens, completion_tokens
    and (optional) latency_s."""
    cats = df["category"].fillna("none").astype(str) if "category" in df else pd.Series(
        "none", index=df.index)
    prompt = df["prompt_tokens"].fillna(0).to_numpy(np.int64)
    output = df["completion_tokens"].fillna(0).to_numpy(np.int64)
    lat = df["latency_s"].to_numpy(float) if "latency_s" in df else None

    def one(mask: np.ndarray) -> dict[str, Any]:
        return group_yield(prompt[mask], output[mask], None if lat is None else lat[mask],
                           max_length, clock)
    return {"max_length": max_length, "overall": one(np.ones(len(df), bool)),
            "by_category": {str(c): one((cats == c).to_numpy())
                            for c in sorted(cats.unique(), key=str)}}


NOTES = [
    "Trainable = output tokens that fit the trainer's max length after the prompt "
    "(min(output, max(N - prompt, 0))); the rest is cut by the trainer. Counted in the "
    "model's own ids (as a pretokenized export holds them).",
    "GPU time: each row costs latency_s / the mean requests in flight per replica "
    "(Little's law over the first-version rows: summed latency / busy replica time), "
    "x the GPUs per replica (a replica without one counts as one engine); cut tokens cost "
    "their share of their row. Busy time only (the run's GPU-hours held also count "
    "start-up and idle engines). Decode-bound (prefill left out); the cut tail runs at "
    "the longest KV cache, so it costs slightly more than shown.",
]


def yield_report(df: pd.DataFrame, max_lengths: Sequence[int],
                 clock: Optional[GpuClock] = None) -> dict[str, Any]:
    """The report's token_yield section: per max length, overall and per category."""
    clock = clock if clock is not None else clock_of(df)
    notes = list(NOTES)
    if clock is None:
        notes.append("No row carries replica, created_at and latency_s: GPU time is not "
                     "measured.")
    return {"max_lengths": list(max_lengths),
            "gpu_clock": clock.to_json() if clock else None,
            "by_max_length": {str(n): yield_by_category(df, n, clock) for n in max_lengths},
            "notes": notes}


class YieldTally:
    """The export's yield, streamed: the clock from every latest row read (a dropped row
    kept its replica busy too), the yield from the rows written."""

    READ_COLUMNS = ["category", "prompt_token_ids", "output_token_ids", *CLOCK_COLUMNS]

    def __init__(self, max_length: int):
        self.max_length = max_length
        self._clock: list[pd.DataFrame] = []
        self._rows: list[pd.DataFrame] = []

    def add(self, read: pa.Table, kept: pa.Table) -> None:
        self._clock.append(read.select(CLOCK_COLUMNS).to_pandas())
        self._rows.append(pd.DataFrame({
            "category": kept["category"].to_pandas(),
            "prompt_tokens": pc.list_value_length(kept["prompt_token_ids"]).to_numpy(
                zero_copy_only=False),
            "completion_tokens": pc.list_value_length(kept["output_token_ids"]).to_numpy(
                zero_copy_only=False),
            "latency_s": kept["latency_s"].to_numpy(zero_copy_only=False)}))

    def result(self) -> dict[str, Any]:
        clock_rows = (pd.concat(self._clock, ignore_index=True) if self._clock
                      else pd.DataFrame(columns=CLOCK_COLUMNS))
        rows = (pd.concat(self._rows, ignore_index=True) if self._rows
                else pd.DataFrame(columns=YIELD_COLUMNS))
        clock = clock_of(clock_rows)
        out = yield_by_category(rows, self.max_length, clock)
        out["gpu_clock"] = clock.to_json() if clock else None
        return out


def export_tally(max_length: Optional[int], columns: list[str]
                 ) -> tuple[Optional["YieldTally"], list[str]]:
    """The export's tally for --trainer-max-length (None without it) and the columns it
    reads besides ``columns``."""
    if not max_length:
        return None, []
    return YieldTally(max_length), [c for c in YieldTally.READ_COLUMNS if c not in columns]


def render_lines(section: Optional[dict[str, Any]]) -> list[str]:
    """The export summary's line for its manifest's token_yield ([] without one)."""
    if not section:
        return []
    o = section["overall"]
    gpu = (f"; the cut ones cost {o['cut_gpu_hours']:.3g} of {o['gpu_hours']:.3g} GPU-h "
           f"({o['cut_gpu_pct']:.1f}%)" if o["gpu_hours"] else "")
    return [f"  trainable at max length {section['max_length']:,}: "
            f"{o['trainable_tokens']:,} of {o['output_tokens']:,} output tokens "
            f"({o['trainable_pct'] or 0:.1f}%), {o['rows_cut']:,} of {o['rows']:,} rows "
            f"cut{gpu}"]


# --- the what-if in trainable tokens --------------------------------------------------

def tail_trainable(mu, sigma, c0, room, cap):
    """For rows known to run past c0 (cut there), L ~ lognormal(mu, sigma) given L > c0:
    (E[min(L, cap, room)], E[min(L, room); L <= cap]). Broadcast; cap > c0."""
    pos = lambda x: np.maximum(x, 1e-9)  # noqa: E731 - log of 0 tokens
    m = np.minimum(cap, room)
    below_c0, f_c0 = parts_below(mu, sigma, pos(c0))
    below_m, f_m = parts_below(mu, sigma, pos(m))
    below_a, _ = parts_below(mu, sigma, pos(np.minimum(room, cap)))
    _, f_cap = parts_below(mu, sigma, np.float64(cap))
    _, f_hi = parts_below(mu, sigma, pos(np.maximum(room, c0)))
    s0 = 1.0 - f_c0
    with np.errstate(invalid="ignore", divide="ignore"):
        every = np.where(m <= c0, m, (below_m - below_c0 + m * (1.0 - f_m)) / s0)
        first = np.where(room > c0, below_a - below_c0, 0.0)
        second = np.where(np.maximum(room, c0) < cap, room * (f_cap - f_hi), 0.0)
        finished = (first + second) / s0
    ok = s0 > 0  # c0 beyond the fit's reach: the row reaches the cap
    return np.where(ok, every, m), np.where(ok, finished, 0.0)


def _points(room: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, row counts) standing for a group's rows by their room N - P."""
    values, counts = np.unique(room, return_counts=True)
    if values.size <= PROMPT_POINTS:
        return values.astype(float), counts.astype(float)
    q = (np.arange(PROMPT_POINTS) + 0.5) / PROMPT_POINTS
    return np.quantile(room, q), np.full(PROMPT_POINTS, room.size / PROMPT_POINTS)


def trainable_forecast(df: pd.DataFrame, categories: np.ndarray, mu: np.ndarray,
                       sigma: np.ndarray, caps: Sequence[int], cap: int,
                       max_lengths: Sequence[int], ci: Sequence[float]) -> list[dict]:
    """Per cap, per max length: expected trainable tokens per row (all rows / finished
    rows only), with the fit's bootstrap range, and relative to the current cap.

    A row whose length is known (finished, or cut at or past the cap asked) counts
    exactly; only a row cut below the cap asked is the fitted lognormal of its category
    given that it ran past its cut. So the figures follow the run's own prompts and
    lengths (whatever links them) and the model only fills in the censored tails.
    df: the fitted rows (finish stop/length; prompt_tokens, completion_tokens,
    category); mu, sigma: (B, G) fits (row 0 the point estimate), G in ``categories``.
    """
    cats = (df["category"].fillna("none").astype(str).to_numpy() if "category" in df
            else np.full(len(df), "none"))
    code = np.searchsorted(categories, cats)
    prompt = df["prompt_tokens"].fillna(0).to_numpy(np.int64)
    tokens = np.maximum(df["completion_tokens"].to_numpy(np.int64), 1)
    censored = (df["finish_reason"].astype(str) == "length").to_numpy()
    n_rows, n_fits = max(len(df), 1), mu.shape[0]
    grid = sorted(set(caps) | {cap})
    out: list[dict] = [{} for _ in caps]
    for n in max_lengths:
        room = np.maximum(n - prompt, 0)
        per_cap = {}
        for c in grid:
            known = ~censored | (tokens >= c)
            every = np.full(n_fits, float(np.minimum(np.minimum(tokens, c), room)[known].sum()))
            finished = np.full(n_fits, float(np.where(
                ~censored & (tokens <= c), np.minimum(tokens, room), 0).sum()))
            tail = ~known
            for g, c0 in set(zip(code[tail].tolist(), tokens[tail].tolist())):
                rows = tail & (code == g) & (tokens == c0)
                values, counts = _points(room[rows])
                e, f = tail_trainable(mu[:, g, None], sigma[:, g, None], float(c0),
                                      values[None, :], float(c))
                every += (e * counts).sum(1)
                finished += (f * counts).sum(1)
            per_cap[c] = (every / n_rows, finished / n_rows)
        for i, c in enumerate(caps):
            out[i][str(n)] = _trainable_entry(*per_cap[c], per_cap[cap], ci)
    return out


def _trainable_entry(every, finished, now, ci) -> dict[str, Any]:
    import warnings
    with warnings.catch_warnings():  # a resample with no rows: NaN, ignored
        warnings.simplefilter("ignore", RuntimeWarning)
        if every.size > 1:
            lo, hi = np.nanpercentile(np.stack([every[1:], finished[1:]]), ci, axis=1)
        else:
            lo = hi = np.full(2, np.nan)
    return {"mean_trainable_tokens": rounded(every[0], 1),
            "mean_trainable_tokens_lo": rounded(lo[0], 1),
            "mean_trainable_tokens_hi": rounded(hi[0], 1),
            "mean_trainable_tokens_finished": rounded(finished[0], 1),
            "mean_trainable_tokens_finished_lo": rounded(lo[1], 1),
            "mean_trainable_tokens_finished_hi": rounded(hi[1], 1),
            "relative_trainable": rounded(every[0] / now[0][0], 4) if now[0][0] else None,
            "relative_trainable_finished": (rounded(finished[0] / now[1][0], 4)
                                            if now[1][0] else None)}
