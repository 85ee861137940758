"""jobs.analysis.report: every figure equals pandas computed directly over the latest rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from jobs.analysis import report
from jobs.io.run_store import RunStore
from jobs.io.storage import write_json_atomic
from tests.support.run_rows import (failure_row, make_row, reject_row, write_rows)

CAP, CAP2 = 4096, 8192


def synthetic_rows(seed: int = 0) -> list[dict]:
    """~400 keys over 4 categories and every prompt bin; 30 continued; a few aborts."""
    rng = np.random.default_rng(seed)
    cats = ["chat", "code", "math", None]
    rows, continued = [], 0
    for i in range(400):
        length = int(np.ceil(np.exp(rng.normal(np.log(2300), 0.63))))
        cut = length > CAP
        tokens = min(length, CAP)
        finished = (not cut) or bool(rng.random() < 0.4)
        finish = "abort" if i % 50 == 7 else ("length" if cut else "stop")
        rows.append(make_row(
            f"k{i:04d}", completion_tokens=tokens, finish_reason=finish,
            category=cats[i % 4], prompt_tokens=int(rng.choice([40, 300, 2000, 6000])
                                                    + rng.integers(0, 200)),
            finished_thinking=finished,
            reasoning_tokens=int(tokens * rng.uniform(0.3, 0.9)) if finished else tokens,
            spec_verify_ct=int(tokens / rng.uniform(2, 4)) if i % 4 else None,
            repetition_ratio=float(rng.choice([0.02, 0.8], p=[0.9, 0.1]))))
        if cut and continued < 30:  # continue it: version 1, cumulative tokens
            continued += 1
            total = min(length, CAP2)
            rows.append(make_row(
                f"k{i:04d}", version=1, completion_tokens=total,
                finish_reason="length" if length > CAP2 else "stop",
                category=cats[i % 4], prompt_tokens=rows[-1]["prompt_tokens"],
                finished_thinking=True, reasoning_tokens=int(total * 0.6),
                spec_verify_ct=None, max_new_tokens=CAP2, budget_history=[CAP, CAP2]))
    return rows


def latest_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows).sort_values(["key", "version"]).drop_duplicates("key", keep="last")
    df["category"] = df["category"].fillna("none")
    return df


@pytest.fixture
def run(store: RunStore):
    rows = synthetic_rows()
    write_rows(store, "data", rows)
    write_rows(store, "failures", [failure_row("f1", "EngineError"),
                                   failure_row("f2", "Timeout"),
                                   failure_row("f2", "EngineError", seconds=5),
                                   failure_row("k0001", "Timeout")])  # k0001 later succeeded
    write_rows(store, "rejects", [reject_row(1, "not valid JSON: Expecting value at column 1"),
                                  reject_row(2, "duplicate id 'a': first seen at in.jsonl:1"),
                                  reject_row(3, "missing 'messages'")])
    return store, rows


def expected_stats(df: pd.DataFrame) -> dict:
    ct = df["completion_tokens"].astype(float)
    cut = df["finish_reason"] == "length"
    spec = df["spec_verify_ct"].astype(float)
    has = spec.notna() & (spec > 0)
    return {
        "rows": len(df), "mean": ct.mean(), "median": ct.median(), "p90": ct.quantile(0.9),
        "p99": ct.quantile(0.99), "max": ct.max(), "truncated_pct": 100 * cut.mean(),
        "clean_stop_pct": 100 * (df["finish_reason"] == "stop").mean(),
        "cut_thinking": int((cut & ~df["finished_thinking"]).sum()),
        "cut_answer": int((cut & df["finished_thinking"]).sum()),
        "degenerate": int((df["repetition_ratio"] > 0.5).sum()),
        "accept": ct[has].sum() / spec[has].sum() if has.any() else None,
        "reasoning": df["reasoning_tokens"].mean(),
        "answer": (ct - df["reasoning_tokens"]).mean(),
        "continued": int((df["continuations"] > 0).sum()),
    }


def assert_matches(got: dict, want: dict) -> None:
    o = got["output_tokens"]
    assert got["rows"] == want["rows"]
    for k in ("mean", "median", "p90", "p99", "max"):
        assert o[k] == pytest.approx(want[k], abs=1e-3), k
    assert got["truncated_pct"] == pytest.approx(want["truncated_pct"], abs=1e-3)
    assert got["clean_stop_pct"] == pytest.approx(want["clean_stop_pct"], abs=1e-3)
    assert got["truncated_while_thinking"] == want["cut_thinking"]
    assert got["truncated_in_answer"] == want["cut_answer"]
    assert got["degenerate"] == want["degenerate"]
    assert got["mean_reasoning_tokens"] == pytest.approx(want["reasoning"], abs=0.01)
    assert got["mean_answer_tokens"] == pytest.approx(want["answer"], abs=0.01)
    assert got["continued_rows"] == want["continued"]
    if want["accept"] is None:
        assert got["accept_length"] is None
    else:
        assert got["accept_length"] == pytest.approx(want["accept"], abs=1e-3)


def test_overall_figures_equal_pandas(run):
    store, rows = run
    rep = report.build_report(store)
    df = latest_frame(rows)
    assert rep["keys"] == df["key"].nunique() == 400
    assert rep["data_rows_all_versions"] == len(rows)
    assert_matches(rep["overall"], expected_stats(df))
    counts = df["finish_reason"].value_counts()
    for reason, n in counts.items():
        assert rep["overall"]["finish_reasons"][reason]["rows"] == n
        assert rep["overall"]["finish_reasons"][reason]["pct"] == pytest.approx(
            100 * n / len(df), abs=1e-3)
    assert rep["overall"]["continuations"] == 30


def test_by_category_and_prompt_bin_equal_pandas(run):
    store, rows = run
    rep = report.build_report(store)
    df = latest_frame(rows)
    assert set(rep["by_category"]) == {"chat", "code", "math", "none"}
    for cat, group in df.groupby("category"):
        assert_matches(rep["by_category"][cat], expected_stats(group))
    p = df["prompt_tokens"]
    bins = {"<256": p < 256, "256-1K": (p >= 256) & (p < 1024),
            "1K-4K": (p >= 1024) & (p < 4096), ">=4K": p >= 4096}
    assert list(rep["by_prompt_bin"]) == list(bins)
    for label, mask in bins.items():
        assert_matches(rep["by_prompt_bin"][label], expected_stats(df[mask]))


def test_failures_rejects_and_budgets(run):
    store, rows = run
    rep = report.build_report(store)
    # f2's latest failure is EngineError; k0001 has a data row so it is not open.
    assert rep["failures"] == {"open": 2, "by_error_class": {"EngineError": 2}}
    assert rep["rejects"]["total"] == 3
    assert {k: v["rows"] for k, v in rep["rejects"]["by_reason"].items()} == {
        "invalid_json": 1, "duplicate_id": 1, "invalid_row": 1}
    df = latest_frame(rows)
    assert rep["budgets"]["caps"] == [
        {"max_new_tokens": CAP, "rows": int((df["max_new_tokens"] == CAP).sum())},
        {"max_new_tokens": CAP2, "rows": 30}]


def test_continued_row_counts_once_with_latest_state(store):
    write_rows(store, "data", [
        make_row("a", 0, completion_tokens=4096, finish_reason="length",
                 finished_thinking=False),
        make_row("a", 1, completion_tokens=5000, finish_reason="stop", max_new_tokens=8192,
                 budget_history=[4096, 8192]),
        make_row("b", 0, completion_tokens=1000)])
    rep = report.build_report(store)
    o = rep["overall"]
    assert rep["keys"] == 2 and rep["data_rows_all_versions"] == 3
    assert o["finish_reasons"] == {"stop": {"rows": 2, "pct": 100.0}}
    assert o["truncated"] == 0 and o["truncated_while_thinking"] == 0
    assert o["output_tokens"]["mean"] == 3000 and o["output_tokens"]["max"] == 5000
    assert o["continued_rows"] == 1 and o["continuations"] == 1


def test_write_report_files(run):
    store, _ = run
    rep = report.report_and_write(store, caps=[5120, 8192])
    root = store.root.path
    on_disk = json.loads(open(f"{root}/report.json").read())
    assert on_disk == json.loads(json.dumps(rep))  # JSON-safe: no NaN, no numpy types
    assert open(f"{root}/report_lengths.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    md = open(f"{root}/report.md").read()
    for heading in ("## Overall", "## By category", "## By prompt length", "## What-if"):
        assert heading in md
    assert "EXTRAPOLATIONS" in md
    assert [r["cap"] for r in rep["forecast"]["rows"]] == [5120, 8192]


def test_cli_prints_and_writes(run, capsys):
    store, _ = run
    assert report.main([store.root.path, "--what-if", "5120,16384"]) == 0
    out = capsys.readouterr().out
    assert "# Run report" in out and "16,384" in out and "wrote" in out


def test_cli_empty_run_fails_clearly(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        report.main([str(tmp_path / "nothing")])
    assert exc.value.code == 1
    assert "no run at" in capsys.readouterr().err


def test_report_and_write_on_a_run_without_rows(store):
    """The job calls report_and_write at the end of every run, even one that wrote nothing."""
    write_rows(store, "failures", [failure_row("f1", "EngineError")])
    rep = report.report_and_write(store)
    assert rep["keys"] == 0 and rep["overall"]["output_tokens"]["mean"] is None
    assert rep["failures"]["open"] == 1 and rep["forecast"]["rows"] == []
    assert (open(f"{store.root.path}/report_lengths.png", "rb").read(4) == b"\x89PNG")


def test_flagged_latest_rows_are_counted_and_named_by_key(store):
    """Only a key's latest row counts: a flagged row regenerated sound is gone from the
    count; one whose part predates the column is "not recorded", not sound."""
    write_rows(store, "data", [
        make_row("cured", 0, integrity_flags=["token_run"], replica="bad"),
        make_row("cured", 1, replica="good"),
        make_row("loops", 0, integrity_flags=["token_run", "ngram_loop"], replica="bad"),
        make_row("loops", 1, integrity_flags=["token_run"], replica="good", category="code"),
        make_row("empty", 0, integrity_flags=["empty_answer"], replica="r1"),
        make_row("old", 0, integrity_flags=None),
        make_row("sound", 0)], per_file=3)
    f = report.report_and_write(store)["flagged"]
    assert f["rows"] == 2 and f["not_recorded"] == 1
    assert f["by_flag"] == {"token_run": 1, "empty_answer": 1}
    assert f["by_category"] == {"chat": 1, "code": 1}
    assert f["keys"] == [
        {"key": "empty", "version": 0, "replica": "r1", "flags": ["empty_answer"]},
        {"key": "loops", "version": 1, "replica": "good", "flags": ["token_run"]}]
    md = open(f"{store.root.path}/report.md").read()
    assert "2 latest rows carry integrity flags (token_run 1, empty_answer 1)" in md
    assert "--regenerate-flagged" in md and "| loops | 1 | good | token_run |" in md
    assert "1 latest rows are in parts written before" in md


def test_a_run_without_flagged_rows_says_nothing_of_them(run):
    store, _ = run
    rep = report.build_report(store)
    assert rep["flagged"] == {"rows": 0, "not_recorded": 0, "by_flag": {},
                              "by_category": {}, "keys": []}
    assert "integrity flags" not in report.render_markdown(rep)


def test_the_report_gives_the_runs_gpu_hours_and_prices_each_cap(store):
    """GPU-hours as the last progress.json recorded them (what the engines held over every
    session); the what-if at that rate: per 1K rows, and raising the cap to each larger one
    for this run's truncated rows (their expected extra tokens / the rate)."""
    from jobs.analysis.gpu_hours import Carried, figures
    write_rows(store, "data", synthetic_rows(3))
    gpu = figures(7200.0, Carried(1.0, 400_000, 1, "GPU-h"), 600_000, rows_left=100,
                  mean_tokens=2000.0, gpus_per_engine=1, engines=2, price=4.0)
    write_json_atomic(store.loc("progress.json"), {"status": "stopped", "remaining": 100,
                                                   "gpu_hours": gpu})
    rep = report.build_report(store, caps=[8192, 16384])  # 8,192: the current cap
    g = rep["gpu_hours"]
    assert (g["spent"], g["sessions"], g["output_tokens"]) == (3.0, 2, 1_000_000)
    rate = 1_000_000 / 3.0
    assert g["output_tok_per_gpu_h"] == pytest.approx(rate, abs=0.1)
    assert g["gpu_hours_per_1b_output_tokens"] == pytest.approx(3000.0, abs=0.01)
    now, up = rep["forecast"]["rows"]
    assert now["gpu_hours_per_1k_rows"] == pytest.approx(1000 * now["mean_tokens"] / rate, rel=1e-3)
    n = rep["forecast"]["rows_fitted"]
    assert now["continue_gpu_hours"] is None and up["extra_tokens_per_row"] > 0
    assert up["continue_gpu_hours"] == pytest.approx(n * up["extra_tokens_per_row"] / rate, rel=1e-3)
    assert up["continue_cost"] == pytest.approx(4 * up["continue_gpu_hours"], abs=0.01)
    md = report.render_markdown(rep)
    assert ("- Spent: 3 GPU-h over 2 session(s) (GPUs held by the run's replicas x wall time; "
            "start-up, ramp and idle included), for 1,000,000 output tokens the run gained: "
            "333K output tok/GPU-h, 3,000.0 GPU-h per 1B output tokens.") in md
    assert "- Cost at 4.00 per GPU-h: 12.00 spent, ~" in md
    assert f"| +{report._hours(up['continue_gpu_hours'])} (" in md
    assert "raise the cap to it: +GPU-h (range), cost" in md


def test_a_run_without_recorded_gpu_hours_says_so(store):
    write_rows(store, "data", synthetic_rows(4)[:50])
    rep = report.build_report(store, caps=[8192])
    assert not rep["gpu_hours"]["recorded"] and rep["gpu_hours"]["spent"] is None
    md = report.render_markdown(rep)
    assert "Not recorded: the run's progress.json has no gpu_hours" in md
    assert "- GPU-h columns: no rate measured" in md
