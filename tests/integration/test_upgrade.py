"""A run written by the previous release (raygen 6de2836, the fixture under
tests/fixtures/runs/raygen-6de2836/, made by that commit's code on the simulator: 26 rows
cut at 512 tokens, 4 permanent failures, 1 bad line) survives the upgrade: this raygen
resumes it with more prompts, retries its failures and continues its truncated rows, and
the run stays exact. Its old files are read as they are: format-2 sidecars without a
rebuild, run.json recorded as format 2 (no key salt), no earlier row redone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jobs.io.run_index import RunIndex
from tests.integration.helpers import assert_run_exact, read, run, run_config, store_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # four sessions

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "raygen-6de2836"
OLD, ADDED = 30, 6


def test_a_run_of_the_previous_release_resumes_exactly(ray_cluster, s3_endpoint, tmp_path,
                                                       caplog):
    shutil.copytree(FIXTURE / "old-run", tmp_path / "runs" / "old-run")
    prompts = tmp_path / "prompts.jsonl"  # the old input, moved, then grown
    shutil.copy(FIXTURE / "prompts.jsonl", prompts)
    with open(prompts, "a") as f:
        for i in range(OLD, OLD + ADDED):
            f.write(json.dumps({"id": f"p{i:05d}", "messages": [
                {"role": "user", "content": f"Prompt {i}: a new one."}]}) + "\n")
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(prompts), run_name="old-run",
                      output=str(tmp_path / "runs"), app_name="upgrade",
                      job={"rows_per_file": 8, "max_new_tokens": 512})
    tree["storage"] = {}
    store = store_of(tree)
    before = read(tree, "data")
    old_sidecars = len(store.part_paths("data")) + len(store.part_paths("failures")) + 1
    index = RunIndex.open(store)
    assert index.reads == {"sidecar": old_sidecars}  # format 2, read as they are
    assert len(index.done) == len(before) == 26 and len(index.open_failed()) == 4

    with caplog.at_level("WARNING", logger="raygen"):
        grown = run(tree)  # settings_hash unchanged by the upgrade, or this is refused
    assert grown.status == "succeeded", grown.text
    assert grown.progress["session_new_prompts"] == ADDED
    assert "has the content of" not in caplog.text or "renamed or moved" in caplog.text
    assert store.read_json("run.json") == {"run_format": 2, "key_salt": ""}
    after = read(tree, "data")
    old_rows = after[after.key.isin(before.key)]
    assert len(old_rows) == len(before)  # not one earlier row redone
    assert sorted(old_rows.created_at) == sorted(before.created_at)
    # one sampling setting: the old rows (no setting column) and the new ones alike
    assert after.setting.isna().all() and after.settings_hash.nunique() == 1

    retried = run(tree, retry_failed=True)
    assert retried.status == "succeeded" and retried.progress["session_retried_failures"] == 4

    continued = run(tree, continue_truncated=True, max_total_tokens=1024)
    assert continued.status == "succeeded"
    cut = read(tree, "data")
    assert continued.progress["session_new_versions"] > 0
    latest = cut.sort_values("version").groupby("key").tail(1)
    assert (latest.budget_history.map(list).map(max) <= 1024).all()
    assert_run_exact(tree, [f"p{i:05d}" for i in range(OLD + ADDED)], bad_lines=["{not json"])
