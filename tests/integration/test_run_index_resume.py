"""A resume on S3 after a crash between parts and their sidecars is exact: the run index
rebuilds the missing sidecars from their parts (and writes them back), the resume
generates exactly the new prompts, and progress counts every row once. The admission
pass goes on from the recorded one: the grown input's new lines only, then nothing."""

from __future__ import annotations

import posixpath

import pytest

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
    assert run(tree).status == "succeeded"
    store = store_of(tree)
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
