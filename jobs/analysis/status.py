"""A run's progress.json as a readable block.

    python -m jobs.analysis.status <run> [--config FILE]

Design decisions:
- Reads only progress.json (one small object): cheap enough to run in a watch loop
  against S3 while the job writes.
- progress.json is rewritten every few seconds while the driver lives. A "running"
  file older than STALE_AFTER_S means nobody is updating it: the driver was most
  likely killed, and the fix is to rerun the same command (runs resume from their
  files). Saying so beats showing a frozen "running" forever.
- Missing fields print as "?" rather than failing: the file's writer may be older or
  newer than this reader.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Optional

from jobs.analysis.gpu_hours import GPU_UNIT, fmt_hours, fmt_money, fmt_rate
from jobs.analysis.run_cli import add_run_args, fail, open_args
from jobs.io.lease_store import read_holder

STALE_AFTER_S = 60.0   # ~3x a typical progress interval (the default is 5-20 s)


def hhmm(seconds: Optional[float]) -> str:
    """Seconds as h:mm ("?" when unknown)."""
    if seconds is None:
        return "?"
    minutes = int(round(float(seconds) / 60))
    return f"{minutes // 60}:{minutes % 60:02d}"


def _n(x: Any, fmt: str = ",") -> str:
    return "?" if x is None else format(x, fmt)


def _bytes(n: Optional[float]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "?"


def stale_hint(snap: dict[str, Any], now: float) -> Optional[str]:
    updated = snap.get("updated_at")
    if snap.get("status") != "running" or updated is None:
        return None
    age = now - float(updated)
    if age <= STALE_AFTER_S:
        return None
    return (f"(stale: last update {max(1, round(age / 60))} min ago — driver probably "
            f"killed; rerun the same command to resume)")


def render(snap: dict[str, Any], now: Optional[float] = None) -> str:
    now = time.time() if now is None else now
    total, done = snap.get("total"), snap.get("completed")
    share = f" ({100 * done / total:.1f}%)" if total and done is not None else ""
    updated = snap.get("updated_at")
    age = f", updated {int(now - float(updated))} s ago" if updated is not None else ""
    lines = [
        f"run        {snap.get('run', '?')}  (model {snap.get('model', '?')})",
        f"status     {snap.get('status', '?')}{age}",
        f"rows       {_n(done)} / {_n(total)} done{share}; {_n(snap.get('failed'))} failed, "
        f"{_n(snap.get('rejected'))} rejected, {_n(snap.get('remaining'))} remaining",
        f"truncated  {100 * (snap.get('truncated_fraction') or 0):.1f}% "
        f"({_n(snap.get('truncated'))} rows hit the budget)",
        f"rate       {_n(snap.get('rate_rows_per_s'), ',.2f')} rows/s, "
        f"{_n(snap.get('rate_output_tok_per_s'), ',.0f')} output tok/s; mean "
        f"{_n(snap.get('mean_output_tokens'), ',.0f')} tok/row",
        f"eta        {hhmm(snap.get('eta_s'))} (h:mm)",
        f"elapsed    {hhmm(snap.get('elapsed_s'))} (h:mm); {_n(snap.get('files'))} files, "
        f"{_bytes(snap.get('bytes_written'))} written",
    ]
    lines.append(gpu_line(snap.get("gpu_hours"), snap.get("remaining")))
    if snap.get("quarantined_parts"):
        lines.append(f"damaged    {snap['quarantined_parts']} part(s) moved to "
                     f"<run>/quarantine/ (reasons beside them); their rows are not done "
                     f"and the next run regenerates them")
    hint = stale_hint(snap, now)
    return "\n".join(lines + ([hint] if hint else []))


def gpu_line(g: Any, remaining: Any) -> str:
    """GPU-hours spent, the forecast for the rows left and the cost (progress.json's
    gpu_hours, jobs/analysis/gpu_hours.py); '?' for a file written before them."""
    if not isinstance(g, dict):
        return "gpu-hours  ? (not in this progress.json)"
    u = g.get("unit") or GPU_UNIT
    line = (f"gpu-hours  {fmt_hours(g.get('spent'))} {u} spent "
            f"({fmt_hours(g.get('session'))} this session)")
    rate = g.get("session_output_tok_per_gpu_h") or g.get("output_tok_per_gpu_h")
    if remaining:
        line += (f"; rows left ~{fmt_hours(g.get('forecast_rows_left'))} {u} at "
                 f"{fmt_rate(rate)} output tok/{u}")
    if g.get("price_per_gpu_h") is not None:
        line += f"; cost {fmt_money(g.get('cost_spent'))} spent"
        if remaining:
            line += f", ~{fmt_money(g.get('cost_forecast_rows_left'))} left"
    return line


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m jobs.analysis.status` and `raygen status`."""
    add_run_args(parser)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.analysis.status", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    store = open_args(args)
    try:
        snap = store.read_json("progress.json")
    except OSError as exc:
        fail(f"cannot read {store.loc('progress.json').uri}: {exc}")
    except ValueError as exc:
        fail(f"{store.loc('progress.json').uri} is not valid JSON: {exc}")
    if snap is None:
        fail(f"no progress.json at {store.uri}: the run has not started there (check the "
             f"path: <job.output>/<job.run_name>)")
    # Any reader may quarantine a part after the driver's last progress.json: list it.
    snap["quarantined_parts"] = len(store.quarantined())
    print(render(snap))
    print(holder_line(store))
    return 0


def holder_line(store, now: Optional[float] = None) -> str:
    """Which job holds the run's lease (jobs/io/lease_store.py), or that none does."""
    try:
        holder = read_holder(store)
    except Exception as exc:  # noqa: BLE001 - progress was readable; say what is not
        return f"holder     ? (cannot read lease.json: {exc})"
    if holder is None:
        return "holder     none (no job holds the run)"
    age = (time.time() if now is None else now) - holder.renewed_at
    return f"holder     {holder.describe()}, lease renewed {age:.0f} s ago"


if __name__ == "__main__":
    sys.exit(main())
