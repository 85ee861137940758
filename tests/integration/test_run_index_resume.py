"""A resume on S3 after a crash between parts and their sidecars is exact: the run index
rebuilds the missing sidecars from their parts (and writes them back), the resume
generates exactly the new prompts, and progress counts every row once. The admission
pass goes on from the recorded one: the grown input's new lines only, then nothing.
The run's GPU-hours (engine-hours here: simulated replicas hold no GPU) add up over the
three sessions, in progress.json, the summary, `raygen status` and the report."""

from __future__ import annotations

import posixpath

import pytest

from jobs.analysis.gpu_hours import fmt_hours
from jobs.io import index_compact
from jobs.io.run_index import RunIndex
from tests.integration.helpers import assert_run_exact, run, run_config, store_of, write_prompts

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two sessions: ~27 s on 2 shared cores

FIRST, ADDED = 24, 8


def test_resume_after_losing_sidecars_is_exact(ray_cluster, s3_endpoint, tmp_path, monkeypatch,
                                               caplog):
    prompts = write_prompts(tmp_path / "p.jsonl", FIRST)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(prompts), app_name="run-index",
                      job={"rows_per_file": 4})
    first = run(tree)
    assert first.status == "succeeded"
    store = store_of(tree)
    spent = [_gpu_hours_of(first, store, earlier=0.0)]
    parts = store.part_paths("data")
    assert len(parts) >= 2
    lost = parts[1:]  # the writer "died" between these parts and their sidecars
    for path in lost:
        store.root.fs.delete_file(store.sidecar_loc("data", posixpath.basename(path)).path)
    for _, path in index_compact.listed(store):  # nor did its end write a compact index
        store.root.fs.delete_file(path)

    write_prompts(prompts, FIRST + ADDED)  # the same prompts plus ADDED new ones
    with caplog.at_level("INFO", logger="raygen"):
        summary = run(tree)
    # the grown input: only its new lines parsed, the recorded pass went on
    assert f"recorded pass reused: 0 input files unread, {ADDED} new lines parsed" in caplog.text
    caplog.clear()
    assert summary.status == "succeeded"
    assert summary.progress["session_rows"] == ADDED
    assert summary.progress["completed"] == summary.progress["total"] == FIRST + ADDED
    assert_run_exact(tree, [f"p{i:05d}" for i in range(FIRST + ADDED)])
    spent.append(_gpu_hours_of(summary, store, earlier=spent[-1]))

    index = RunIndex.open(store)  # the session's end wrote a compact index: one read
    assert index.reads == {"compact": 1} and len(index.done) == FIRST + ADDED
    with monkeypatch.context() as m:  # every sidecar is back: an open without it reads no part
        m.setenv("RAYGEN_INDEX_COMPACT", "0")
        assert RunIndex.open(store).reads == {"sidecar": len(store.part_paths("data"))}

    # The input is unchanged since: the next session reuses the recorded admission pass
    # (jobs/pipeline/admission_cache.py, on S3), reads no input line, has nothing to do.
    with caplog.at_level("INFO", logger="raygen"):
        again = run(tree)
    assert "recorded pass reused: 1 input files unread, 0 new lines parsed" in caplog.text
    assert again.status == "succeeded" and again.progress["session_rows"] == 0
    assert again.progress["completed"] == again.progress["total"] == FIRST + ADDED
    spent.append(_gpu_hours_of(again, store, earlier=spent[-1]))
    g = again.progress["gpu_hours"]
    assert g["sessions"] == 3 and g["output_tokens"] == again.progress["output_tokens"]
    assert store.read_json("report.json")["gpu_hours"]["spent"] == spent[-1]
    from jobs.analysis.status import render
    assert f"gpu-hours  {fmt_hours(spent[-1])} engine-h spent" in render(again.progress)


def _gpu_hours_of(summary, store, earlier: float) -> float:
    """A session's GPU-hours: its two replicas held their engines for about the session's
    time (no GPU: engine-hours), on top of what the earlier sessions spent; the same in
    progress.json and the summary. Returns the run's total."""
    g = summary.progress["gpu_hours"]
    assert store.read_json("progress.json")["gpu_hours"] == g
    assert g["unit"] == "engine-h" and g["measured"] and g["engines"] == 2
    elapsed_h = summary.progress["elapsed_s"] / 3600
    # from the deploy (before progress starts) to the last update, x 2 replicas
    assert 2 * elapsed_h * 0.8 <= g["session"] <= 2 * (elapsed_h + 120 / 3600), g
    assert g["earlier_sessions"] == earlier
    assert abs(g["spent"] - (earlier + g["session"])) <= 2e-6  # each rounded to 6 places
    assert g["forecast_rows_left"] == 0.0  # nothing left
    assert (f"  engine-h:  {fmt_hours(g['session'])} engine-h this session (2 engines, no "
            f"GPU each: engine-hours), {fmt_hours(g['spent'])} for the run") in summary.text
    return g["spent"]
