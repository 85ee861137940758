"""A resume on S3 after a crash between parts and their sidecars is exact: the run index
rebuilds the missing sidecars from their parts (and writes them back), the resume
generates exactly the new prompts, and progress counts every row once."""

from __future__ import annotations

import posixpath

import pytest

from jobs.io.run_index import RunIndex
from tests.integration.helpers import assert_run_exact, run, run_config, store_of, write_prompts

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two sessions: ~27 s on 2 shared cores

FIRST, ADDED = 24, 8


def test_resume_after_losing_sidecars_is_exact(ray_cluster, s3_endpoint, tmp_path):
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

    write_prompts(prompts, FIRST + ADDED)  # the same prompts plus ADDED new ones
    summary = run(tree)
    assert summary.status == "succeeded"
    assert summary.progress["session_rows"] == ADDED
    assert summary.progress["completed"] == summary.progress["total"] == FIRST + ADDED
    assert_run_exact(tree, [f"p{i:05d}" for i in range(FIRST + ADDED)])

    index = RunIndex.open(store)  # every sidecar is back: the next open reads no part
    assert index.reads == {"sidecar": len(store.part_paths("data"))}
    assert len(index.done) == FIRST + ADDED
