"""The report's thinking budget: the budget in effect, and per budget the rows cut while
thinking, cut in the answer and ended at the budget; parts written before the
max_thinking_tokens column read as rows without one."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.analysis import report
from jobs.io.schema import DATA
from tests.support.run_rows import make_row, write_rows


def _rows(prefix: str, budget, n: int, cut_thinking: int, cut_answer: int,
          at_budget: int = 0) -> list[dict]:
    rows = []
    for i in range(n):
        thinking_cut = i < cut_thinking
        answer_cut = cut_thinking <= i < cut_thinking + cut_answer
        reasoning = (budget or 0) + 1 if i >= n - at_budget else 20
        rows.append(make_row(
            f"{prefix}{i:03d}", completion_tokens=100 if thinking_cut or answer_cut else 80,
            max_new_tokens=100, finish_reason="length" if thinking_cut or answer_cut else "stop",
            finished_thinking=not thinking_cut,
            reasoning_tokens=100 if thinking_cut else reasoning, max_thinking_tokens=budget))
    return rows


def test_rows_under_two_budgets_read_as_before_and_after(store):
    before = _rows("old", None, 20, cut_thinking=6, cut_answer=2)
    # a part written before the column existed (its sidecar is rebuilt from it)
    table = pa.Table.from_pylist(before, schema=DATA).drop_columns(["max_thinking_tokens"])
    store.root.fs.create_dir(store.loc("data").path)
    pq.write_table(table, store.loc("data", "part-old.parquet").path)
    after = _rows("new", 32, 20, cut_thinking=0, cut_answer=3, at_budget=10)
    write_rows(store, "data", after)
    rep = report.build_report(store)
    none, budget = (dict(e) for e in rep["thinking_budgets"])
    # GPU time by Little's law: the 40 rows ran together on one replica for 1 s (each
    # latency 1 s, all written at T0): 40 in flight, 1/40 replica-second each.
    gpu = {k: (none.pop(k), budget.pop(k)) for k in
           ("gpu_hours", "truncated_while_thinking_gpu_hours")}
    assert gpu["gpu_hours"] == (float(f"{20 / 40 / 3600:.4g}"),) * 2
    assert gpu["truncated_while_thinking_gpu_hours"] == (float(f"{6 / 40 / 3600:.4g}"), 0.0)
    assert none == {"max_thinking_tokens": None, "rows": 20, "truncated": 8,
                    "truncated_while_thinking": 6, "truncated_in_answer": 2,
                    "thinking_ended_at_budget": None, "mean_reasoning_tokens": 44.0,
                    "mean_output_tokens": 88.0}
    assert budget == {"max_thinking_tokens": 32, "rows": 20, "truncated": 3,
                      "truncated_while_thinking": 0, "truncated_in_answer": 3,
                      "thinking_ended_at_budget": 10, "mean_reasoning_tokens": 26.5,
                      "mean_output_tokens": 83.0}
    md = report.render_markdown(rep)
    assert "Thinking budget (max_thinking_tokens): none (20 rows), 32 (20 rows)." in md
    assert "| none | 20 | 8 | 6 | 2 | - | 44.0 | 88.0 | 0.000139 | 4.17e-05 |" in md
    assert "| 32 | 20 | 3 | 0 | 3 | 10 | 26.5 | 83.0 | 0.000139 | 0 |" in md


def test_a_run_without_a_budget_says_none_and_has_no_budget_section(store):
    write_rows(store, "data", _rows("k", None, 10, cut_thinking=3, cut_answer=1))
    md = report.render_markdown(report.build_report(store))
    assert "Thinking budget (max_thinking_tokens): none (10 rows)." in md
    assert "## Thinking budget" not in md
