"""GPU-hours: what raygen counts as one, and the arithmetic every figure shares.

A GPU-hour is one GPU held by the run's replicas for one hour of wall time: GPUs per
replica (``serve.num_gpus_per_replica``; 1 for an SGLang cuda engine) x the replicas
alive x the session's wall time, from when the session starts deploying (or attaching
to) its engines to its last progress update. Each replica's time comes from its own
clock record (serve_apps/engine_clock.py: when its engine started, its scrapes), so an
engine replaced mid-session counts its start-up and a gone one stops counting
(jobs/runs/engine_idle.py measures it). Engines left running between commands serve
no session and are not counted.

A replica that reserves no GPU (SGLang's CPU engine, the simulator) counts as one: its
figures are engine-hours (unit ``engine-h``), so a CPU or simulated run shows what it
held, never a silent 0.

The run's total adds up across sessions: each session starts from what the previous
progress.json says the run spent (``Carried``) and adds its own. The rate is output
tokens the run gained per GPU-hour held, so it includes start-up, ramp and tail: the
forecast for the rows left is what they cost all-in at the rate measured, not at the
engines' peak. Every function here is pure (a virtual clock in the unit tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

GPU_UNIT, ENGINE_UNIT = "GPU-h", "engine-h"
FORMAT = 1  # progress.json's gpu_hours object; a reader takes what it knows of any format


def engine_weight(gpus_per_engine: Optional[float]) -> float:
    """What one replica counts for: its GPUs, or 1 when it reserves none (engine-hours)."""
    return float(gpus_per_engine) if gpus_per_engine and gpus_per_engine > 0 else 1.0


def unit(gpus_per_engine: Optional[float]) -> str:
    return GPU_UNIT if gpus_per_engine and gpus_per_engine > 0 else ENGINE_UNIT


def _number(value: Any) -> Optional[float]:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if x == x and x not in (float("inf"), float("-inf")) and x >= 0 else None


@dataclass(frozen=True)
class Carried:
    """What the run's earlier sessions spent, as the previous progress.json says."""

    gpu_hours: float = 0.0
    output_tokens: int = 0   # tokens the run gained while those hours were counted
    sessions: int = 0        # sessions counted in them
    unit: Optional[str] = None

    @classmethod
    def of(cls, progress: Optional[dict[str, Any]]) -> "Carried":
        """From a progress.json (any version; one without gpu_hours carries nothing: its
        sessions predate the count)."""
        found = (progress or {}).get("gpu_hours")
        if not isinstance(found, dict):
            return cls()
        hours = _number(found.get("spent")) or 0.0
        tokens = _number(found.get("output_tokens")) or 0.0
        sessions = _number(found.get("sessions")) or 0.0
        return cls(hours, int(tokens), int(sessions),
                   found.get("unit") if found.get("unit") in (GPU_UNIT, ENGINE_UNIT) else None)


def rate(output_tokens: float, hours: float) -> Optional[float]:
    """Output tokens per GPU-hour; None until both are positive (nothing measured yet)."""
    if hours is None or hours <= 0 or output_tokens is None or output_tokens <= 0:
        return None
    return output_tokens / hours


def hours_for(output_tokens: float, tokens_per_hour: Optional[float]) -> Optional[float]:
    """GPU-hours that many output tokens cost at the rate; 0 for none, None without a rate."""
    if output_tokens is not None and output_tokens <= 0:
        return 0.0
    if not tokens_per_hour or output_tokens is None:
        return None
    return output_tokens / tokens_per_hour


def cost(hours: Optional[float], price: Optional[float]) -> Optional[float]:
    return None if hours is None or price is None else hours * price


def _r(x: Optional[float], nd: int = 6) -> Optional[float]:
    """Hours to 6 decimals (3.6 ms of one GPU: a CPU test run's are seconds)."""
    return None if x is None else round(x, nd)


def figures(session_gpu_s: Optional[float], carried: Carried, session_tokens: int,
            rows_left: int, mean_tokens: float, gpus_per_engine: Optional[float] = None,
            engines: Optional[int] = None, price: Optional[float] = None) -> dict[str, Any]:
    """progress.json's ``gpu_hours`` object.

    session_gpu_s: GPU-seconds (x engine_weight) the session's replicas held so far, None
    when no engine reported a clock (then the session adds nothing and says so);
    session_tokens: output tokens the run gained this session; rows_left x mean_tokens:
    the output the rows left are expected to need. The rate is the session's own once it
    has gained tokens, else the run's as carried (a session that only attached so far).
    """
    session_h = (session_gpu_s or 0.0) / 3600.0
    spent = carried.gpu_hours + session_h
    gained = max(int(session_tokens), 0)
    run_tokens = carried.output_tokens + gained
    session_rate = rate(gained, session_h)
    run_rate = rate(run_tokens, spent)
    used = session_rate if session_rate is not None else run_rate
    if rows_left > 0 and not mean_tokens > 0:
        left = None  # no row done yet: the output they need is not known
    else:
        left = hours_for(max(rows_left, 0) * mean_tokens, used)
    return {
        "format": FORMAT,
        "unit": unit(gpus_per_engine) if gpus_per_engine is not None else (
            carried.unit or ENGINE_UNIT),
        "gpus_per_engine": gpus_per_engine,
        "engines": engines,
        "measured": session_gpu_s is not None,
        "session": _r(session_h), "earlier_sessions": _r(carried.gpu_hours),
        "spent": _r(spent), "sessions": carried.sessions + 1,
        "output_tokens": run_tokens,
        "session_output_tok_per_gpu_h": _r(session_rate, 1),
        "output_tok_per_gpu_h": _r(run_rate, 1),
        "forecast_rows_left": _r(left),
        "price_per_gpu_h": price,
        "cost_spent": _r(cost(spent, price), 2),
        "cost_forecast_rows_left": _r(cost(left, price), 2),
    }


def fmt_hours(x: Optional[float]) -> str:
    """GPU-hours with three significant digits (a small run's are fractions of one)."""
    if x is None:
        return "?"
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def fmt_rate(x: Optional[float]) -> str:
    if not x:
        return "?"
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if x >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_money(x: Optional[float]) -> str:
    return "?" if x is None else f"{x:,.2f}"


def describe(g: Optional[dict[str, Any]], rows_left: Optional[int] = None) -> list[str]:
    """The summary's lines for a progress.json ``gpu_hours`` object ([] without one)."""
    if not isinstance(g, dict):
        return []
    u = g.get("unit") or GPU_UNIT
    engines = g.get("engines")
    held = ("no engine reported its clock: not counted" if not g.get("measured") else
            f"{engines} engine{'s' if engines != 1 else ''}"
            + (f" x {g['gpus_per_engine']:g} GPU" if u == GPU_UNIT and g.get("gpus_per_engine")
               else ", no GPU each: engine-hours"))
    label = ("GPU-hours:" if u == GPU_UNIT else "engine-h:").ljust(11)
    line = (f"  {label}{fmt_hours(g.get('session'))} {u} this session ({held}), "
            f"{fmt_hours(g.get('spent'))} for the run")
    if g.get("earlier_sessions"):
        line += f" ({fmt_hours(g['earlier_sessions'])} in earlier sessions)"
    left = g.get("forecast_rows_left")
    rate_used = g.get("session_output_tok_per_gpu_h") or g.get("output_tok_per_gpu_h")
    if rows_left:
        line += (f"; ~{fmt_hours(left)} {u} for the {rows_left:,} rows left at "
                 f"{fmt_rate(rate_used)} output tok/{u}" if left is not None else
                 f"; the {rows_left:,} rows left: not forecast yet (no rate measured)")
    lines = [line]
    if g.get("price_per_gpu_h") is not None:
        cost_line = (f"  cost:      {fmt_money(g.get('cost_spent'))} spent at "
                     f"{fmt_money(g['price_per_gpu_h'])} per {u}")
        if rows_left and g.get("cost_forecast_rows_left") is not None:
            cost_line += f", ~{fmt_money(g['cost_forecast_rows_left'])} for the rows left"
        lines.append(cost_line)
    return lines
