"""Figures of one mode and the markdown tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from bench.modes import ModeResult

MiB = 1 << 20
COLUMNS = ["mode", "rows", "wall s", "output tok/s", "× plain", "steady tok/s (engines)",
           "capacity tok/s", "saturation", "tail s (99% done→all written)", "longest req s",
           "tail ÷ longest",
           "CPU ms/row", "peak RSS MiB"]


@dataclass
class Figures:
    mode: str
    rows: int
    expected_rows: int
    errors: int
    wall_s: float
    tok_s: float
    ratio_plain: Optional[float]
    steady_tok_s: Optional[float]
    capacity_tok_s: float
    saturation: Optional[float]
    window: tuple[float, float]
    tail_s: float           # last row durably written - 99% of results available
    last_row_s: float       # last result available - 99% of results available
    return_s: float         # the mode returned (job finished) - last row written
    ramp_s: Optional[float]  # start -> engines first at >= 90% of capacity
    first_request_s: Optional[float]  # start -> the earliest (result time - its latency)
    batch: Optional[dict]    # engines' running/queued requests in the steady window
    longest_s: float
    tail_ratio: Optional[float]
    cpu_ms_row: float
    cpu_by_role: dict[str, float]
    cpu_by_component: dict[str, float]
    peak_rss_mib: float
    rss_by_role: dict[str, float]
    notes: list[str]
    idle_gpu_s: Optional[dict] = None  # raygen: the session's engine_idle_gpu_s
    retractions: Optional[float] = None  # the engines' retraction counters over the mode
    inflight: str = ""
    engine_cpu_s: float = 0.0   # the engines' processes over the mode
    cpu_share: Optional[float] = None  # the mode's CPU / (its CPU + the engines')

    def row(self) -> list[str]:
        return [self.mode, f"{self.rows}/{self.expected_rows}", f"{self.wall_s:.1f}",
                f"{self.tok_s:,.0f}", _f(self.ratio_plain, "{:.3f}"),
                _f(self.steady_tok_s, "{:,.0f}"),
                ("n/a (real engine)" if self.capacity_tok_s is None else
                 f"{self.capacity_tok_s:,.0f}" if self.capacity_tok_s else "∞ (zero latency)"),
                _f(self.saturation, "{:.3f}"), f"{self.tail_s:.2f}", f"{self.longest_s:.2f}",
                _f(self.tail_ratio, "{:.2f}"), f"{self.cpu_ms_row:.2f}",
                f"{self.peak_rss_mib:,.0f}"]


def _f(value: Optional[float], fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def figures(res: ModeResult, capacity_tok_s: Optional[float], plain_tok_s: Optional[float],
            full_batch: float = 35.0) -> Figures:
    """full_batch: running requests from which an engine decodes at capacity
    (max_decode_tok_s / per_request_decode_tok_s). capacity_tok_s None: a real engine,
    whose capacity only the simulator states."""
    wall = res.ended_at - res.started_at
    tok_s = res.output_tokens / wall if wall > 0 else 0.0
    done = np.sort(res.done_at)
    steady = saturation = None
    window = (0.0, 0.0)
    tail = last = ret = 0.0
    batch = None
    if done.size:
        t10, t90, t99 = (float(np.quantile(done, q)) for q in (0.10, 0.90, 0.99))
        window = (t10 - res.started_at, t90 - res.started_at)
        steady = res.watch.rate(t10, t90) if res.watch and res.watch.trustworthy() else None
        batch = res.watch.batch_stats(t10, t90, full_batch) if res.watch else None
        if steady is not None and capacity_tok_s:
            saturation = steady / capacity_tok_s
        durable = res.durable_at[np.isfinite(res.durable_at)]
        # The tail: 99% of results available -> every row durably written (files are
        # written per ~256 rows, so "99% written" would only measure file granularity).
        last_written = float(durable.max()) if durable.size else res.ended_at
        tail, last, ret = last_written - t99, float(done[-1]) - t99, res.ended_at - last_written
    longest = float(res.latency_s.max()) if res.latency_s.size else 0.0
    ramp = None
    if res.watch and capacity_tok_s:
        hit = res.watch.first_time_at(0.9 * capacity_tok_s)
        ramp = None if hit is None else hit - res.started_at
    first = None
    if res.done_at.size and res.latency_s.size == res.done_at.size:
        first = float(np.min(res.done_at - res.latency_s)) - res.started_at
    cpu_total = sum(res.cpu_s.values())
    share = cpu_total / (cpu_total + res.engine_cpu_s) if res.engine_cpu_s > 0 else None
    return Figures(
        mode=res.mode, rows=res.rows, expected_rows=res.expected_rows, errors=res.errors,
        wall_s=wall, tok_s=tok_s, ratio_plain=(tok_s / plain_tok_s) if plain_tok_s else None,
        steady_tok_s=steady, capacity_tok_s=capacity_tok_s, saturation=saturation,
        window=window, tail_s=tail, last_row_s=last, return_s=ret, ramp_s=ramp, batch=batch,
        first_request_s=first, idle_gpu_s=res.idle_gpu_s, longest_s=longest,
        tail_ratio=(tail / longest) if longest > 0 else None,
        cpu_ms_row=1000.0 * cpu_total / max(res.rows, 1),
        cpu_by_role=_by_role(res.cpu_s),
        cpu_by_component={k: round(v, 2) for k, v in res.cpu_s.items() if abs(v) >= 0.005},
        peak_rss_mib=res.peak_rss_total / MiB,
        rss_by_role={k: round(v / MiB, 1) for k, v in res.peak_rss.items()},
        notes=list(res.notes), engine_cpu_s=res.engine_cpu_s, cpu_share=share,
        retractions=res.retractions, inflight=res.inflight)


def _by_role(cpu: dict[str, float]) -> dict[str, float]:
    from bench.procs import COMPONENTS
    out: dict[str, float] = {}
    for component, value in cpu.items():
        role = COMPONENTS.get(component, component)
        out[role] = out.get(role, 0.0) + value
    return {k: round(v, 2) for k, v in out.items()}


def markdown(figs: list[Figures], header: list[str]) -> str:
    lines = list(header) + ["", "| " + " | ".join(COLUMNS) + " |",
                            "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(f.row()) + " |" for f in figs]
    lines += ["", "Details:", ""]
    for f in figs:
        after_first = (f.ramp_s - f.first_request_s
                       if f.ramp_s is not None and f.first_request_s is not None else None)
        lines.append(
            f"- **{f.mode}**: first request {_f(f.first_request_s, '{:.1f}')} s after start; "
            f"engines first at ≥90% of capacity "
            f"{_f(f.ramp_s, '{:.1f}')} s after start ({_f(after_first, '{:.1f}')} s after "
            f"the first request); "
            + (f"engines' idle GPU-s {f.idle_gpu_s}; " if f.idle_gpu_s else "") +
            f"steady window {f.window[0]:.1f}–{f.window[1]:.1f} s after start"
            + (f" (per engine: {f.batch['mean_running']:.1f} running, min "
               f"{f.batch['min_running']:.0f}, {f.batch['mean_queued']:.1f} queued; below a full "
               f"batch in {100 * f.batch['below_full_batch']:.1f}% of scrapes)" if f.batch else "")
            + "; "
            f"last result {f.last_row_s:.2f} s after 99% of results were available, "
            f"the mode returned {f.return_s:.2f} s after the last row was written; "
            f"errors {f.errors}; "
            f"CPU s by role {f.cpu_by_role} (by component {f.cpu_by_component}); "
            f"engines' CPU {f.engine_cpu_s:.1f} s, this mode's share of all CPU "
            f"{_f(f.cpu_share and 100 * f.cpu_share, '{:.1f}%')}; "
            f"peak RSS MiB by role {f.rss_by_role}"
            + (f"; {'; '.join(f.notes)}" if f.notes else ""))
    return "\n".join(lines) + "\n"


KV_COLUMNS = ["mode", "rows in flight", "output tok/s", "steady tok/s (engines)",
              "retractions", "retracted / rows", "× anchor", "× raygen fixed"]
CLEAN = 0.01  # retractions per row a point may have and still be the anchor (as raygen tune)


def _retracted_share(f: Figures) -> Optional[float]:
    return f.retractions / f.rows if f.retractions is not None and f.rows else None


def kv_table(figs: list[Figures]) -> str:
    """Issue 36's comparison with a KV pool that binds: every mode's output tok/s and
    the engines' retractions, against the anchor and raygen fixed (each raygen mode's last
    run: an earlier one may be a warm-up), then the verdict on
    the targets (adaptive >= 0.97x the anchor, retractions <= 1% of rows, >= 1.2x
    raygen fixed when fixed retracts). The anchor: the plain client's best concurrency
    among those retracting <= 1% of their rows (the point `raygen tune` would pick: a
    point that retracts more is not one to run at), or its best overall when none is."""
    plains = [f for f in figs if f.mode == "plain" or f.mode.startswith("plain@")]
    clean = [f for f in plains if (_retracted_share(f) or 0.0) <= CLEAN]
    anchor = max(clean or plains, key=lambda f: f.tok_s, default=None)
    # The last run of each raygen mode: a leading one warms the cluster up (the first Ray
    # Data job of a cluster starts its worker processes: tens of seconds on a loaded box).
    fixed = next((f for f in reversed(figs) if f.mode == "raygen_fixed"), None)
    lines = ["| " + " | ".join(KV_COLUMNS) + " |", "|" + "|".join("---" for _ in KV_COLUMNS) + "|"]
    for f in figs:
        lines.append("| " + " | ".join([
            f.mode + (" (anchor)" if f is anchor else ""), f.inflight or "n/a",
            f"{f.tok_s:,.0f}", _f(f.steady_tok_s, "{:,.0f}"), _f(f.retractions, "{:,.0f}"),
            _f(_retracted_share(f), "{:.2%}"),
            _f(anchor and f.tok_s / anchor.tok_s, "{:.3f}"),
            _f(fixed and fixed.tok_s and f.tok_s / fixed.tok_s, "{:.3f}")]) + " |")
    adaptive = next((f for f in reversed(figs) if f.mode in ("raygen", "raygen_adaptive")
                     and f.inflight.startswith("adaptive")), None)
    if adaptive and anchor:
        share = _retracted_share(adaptive) or 0.0
        verdict = [f"adaptive / anchor {adaptive.tok_s / anchor.tok_s:.3f} (target >= 0.97: "
                   f"{'met' if adaptive.tok_s >= 0.97 * anchor.tok_s else 'MISSED'}"
                   + ("" if clean else "; no plain point retracted <= 1%: the anchor is the "
                      "best overall") + ")",
                   f"adaptive retractions {share:.2%} of rows (target <= 1%: "
                   f"{'met' if share <= CLEAN else 'MISSED'})"]
        if fixed:
            ratio = adaptive.tok_s / fixed.tok_s if fixed.tok_s else float("inf")
            verdict.append(
                f"adaptive / raygen fixed {ratio:.3f} with fixed retracting "
                f"{_retracted_share(fixed) or 0.0:.2%} of rows (target >= 1.2 when fixed "
                f"retracts: " + ("met" if ratio >= 1.2 else "MISSED" if fixed.retractions
                                 else "n/a, fixed did not retract") + ")")
        lines += ["", "Targets: " + "; ".join(verdict) + "."]
    return "\n".join(lines) + "\n"
