"""The report's thinking-budget section: what job.sampling.max_thinking_tokens did.

One entry per budget the run's rows ran under (``None``: rows sent without one, e.g.
parts written before the column existed), in that order, so a run with rows under
several budgets reads as before and after. Each says how many rows were cut at
max_new_tokens while thinking (no answer at all) and in the answer, and how many had
their thinking ended at the budget: SGLang forces the think end once a row has thought
that many tokens, so such a row's reasoning (which counts the think end) exceeds it.
With the run's GPU clock (jobs/analysis/token_yield.py: a row's latency over the requests
in flight with it), each also says the GPU-hours its rows took and those of the rows cut
while thinking: GPU time that bought no answer.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pandas as pd

from jobs.analysis.numbers import rounded


def _gpu_hours(clock: Any, latency: pd.Series) -> Optional[float]:
    if clock is None:
        return None
    seconds = float(np.nansum(clock.gpu_seconds(latency.astype(float).to_numpy())))
    return float(f"{seconds / 3600:.4g}")


def thinking_budgets(df: pd.DataFrame, clock: Any = None) -> list[dict[str, Any]]:
    """One entry per budget (see the module docstring); ``clock``: the run's GpuClock,
    or None (GPU-hours null)."""
    budget = df["max_thinking_tokens"]
    values: list[Optional[int]] = [None] if budget.isna().any() else []
    values += sorted(int(v) for v in budget.dropna().unique())
    out = []
    for value in values:
        rows = df[budget.isna()] if value is None else df[budget == value]
        cut = rows["finish_reason"] == "length"
        done = rows["finished_thinking"].fillna(False).astype(bool)
        reasoning = rows["reasoning_tokens"].astype(float)
        out.append({
            "max_thinking_tokens": value, "rows": len(rows),
            "truncated": int(cut.sum()),
            "truncated_while_thinking": int((cut & ~done).sum()),
            "truncated_in_answer": int((cut & done).sum()),
            "thinking_ended_at_budget": (None if value is None
                                         else int((done & (reasoning > value)).sum())),
            "mean_reasoning_tokens": rounded(reasoning.mean(), 1),
            "mean_output_tokens": rounded(rows["completion_tokens"].astype(float).mean(), 1),
            "gpu_hours": _gpu_hours(clock, rows["latency_s"]),
            "truncated_while_thinking_gpu_hours": _gpu_hours(
                clock, rows.loc[cut & ~done, "latency_s"]),
        })
    return out


def _cell(x: Any) -> str:
    return "-" if x is None else f"{x:,}"


def _name(entry: dict[str, Any]) -> str:
    return "none" if entry["max_thinking_tokens"] is None else _cell(entry["max_thinking_tokens"])


def in_effect(entries: list[dict[str, Any]]) -> str:
    """The budgets in effect for the report's header: "none (300 rows)", "128 (300 rows)"."""
    return ", ".join(f"{_name(e)} ({e['rows']:,} rows)" for e in entries) or "-"


def budgets_md(entries: list[dict[str, Any]]) -> list[str]:
    """The markdown section; nothing for a run that never set a budget."""
    if all(e["max_thinking_tokens"] is None for e in entries):
        return []
    lines = ["## Thinking budget (max_thinking_tokens)", "",
             "| budget | rows | truncated | cut thinking | cut answer | thinking ended at "
             "budget | mean reasoning tok | mean output tok | GPU-h (busy) | cut thinking "
             "GPU-h |", "|" + "---|" * 10]
    for e in entries:
        lines.append("| " + " | ".join([_name(e)] + [_cell(e[k]) for k in (
            "rows", "truncated", "truncated_while_thinking", "truncated_in_answer",
            "thinking_ended_at_budget", "mean_reasoning_tokens", "mean_output_tokens")]
            + [_hours(e.get("gpu_hours")), _hours(e.get("truncated_while_thinking_gpu_hours"))])
            + " |")
    return lines + [""]


def _hours(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.3g}" if x < 1000 else f"{x:,.0f}"
