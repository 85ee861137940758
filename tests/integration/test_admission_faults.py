"""Admission under real faults and real operator mistakes: Ray workers of the data
plane killed with SIGKILL mid-run, an inserted input line, a renamed input file, a
prompt edited under its id, context overflows sent again after a policy change."""

from __future__ import annotations

import json
import logging
import os
import random
import threading

import pytest

from bench.chaos import DATA_PLANE, Killer
from jobs.pipeline.validate import parse_row
from jobs.runs.run import RunError
from tests.integration.helpers import run_config, slowed, write_prompts
from tests.integration.helpers import assert_run_exact, read, run, store_of

pytestmark = pytest.mark.integration

BAD = ['{"id": "broken", "messages": [', '{"id": "empty", "messages": []}']


def keys_of(path) -> list[str]:
    out = []
    for raw in path.read_text().splitlines():
        try:
            out.append(parse_row(raw)["key"])
        except ValueError:
            pass
    return out


class _Session:
    """What bench.chaos.Killer watches (a driver's Popen there): poll() is None while
    the in-process session runs."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def poll(self):
        return 0 if self.done.is_set() else None


def _chaos_trial(tree: dict, seed: int, kills: int, stages: tuple[str, ...] = DATA_PLANE,
                 interval_s: tuple[float, float] = (1.0, 3.0), max_attempts: int = 6,
                 kill_attempts: int = 2) -> dict:
    """bench.chaos.chaos_trial with the sessions in this process: its Killer kills data
    plane workers during the first ``kill_attempts`` sessions, and the run is rerun until
    a session succeeds. The killed processes are Ray workers, not the driver, so the
    sessions need no driver (a Ray job, every worker new) of their own."""
    rng = random.Random(seed)
    statuses, killed = [], []
    for attempt in range(max_attempts):
        session = _Session()
        killer = Killer(os.getpid(), rng, kills - len(killed) if attempt < kill_attempts else 0,
                        interval_s, stages)
        thread = threading.Thread(target=killer.run, args=(session,), daemon=True)
        thread.start()
        try:
            statuses.append(run(tree).status)
        except RunError as exc:
            statuses.append(f"failed: {str(exc).splitlines()[0][:200]}")
        finally:
            session.done.set()
            thread.join()
        killed += killer.killed
        if statuses[-1] == "succeeded":
            break
    return {"seed": seed, "kills": killed, "attempts": len(statuses), "statuses": statuses}


@pytest.mark.slow
def test_chaos_kill_data_plane_workers_then_rerun_is_exact(ray_cluster, s3_endpoint, tmp_path):
    """kill -9 random read/validate+admit/generate/write workers of THIS cluster (found
    under our raylet), rerun until success: nothing lost, duplicated or wrongly rejected."""
    rows = write_prompts(tmp_path / "p.jsonl", 160,
                         extra_lines=BAD + ['{"id": "p00003", "messages": '
                                            '[{"role": "user", "content": "dup"}]}'])
    keys = [f"p{i:05d}" for i in range(160)]
    bad = rows.read_text().splitlines()[160:]
    results = []
    # seed 1: any data-plane stage; seed 2: only validate+admit workers, often (the
    # stage whose re-execution rejected good rows as duplicates of themselves: 2 of 8
    # such kills did on the old ledger, measured with bench.chaos --stages admit_batch)
    plans = {1: ("ReadPromptFiles", "validate_batch", "admit_batch", "GenerateRows", "Write"),
             2: ("admit_batch",)}
    for seed, stages in plans.items():
        tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                          run_name=f"chaos-{seed}-{os.getpid()}",
                          job={"rows_per_file": 16, "batch_size": 8, "max_actors": 2,
                               "retries": {"max_attempts": 8, "backoff_initial_s": 0.2,
                                           "backoff_max_s": 2}})
        # The shared fast app's engines as slow as the slow app's (5x) while the trial
        # runs: kills land mid-session, with no app of its own deployed for it.
        with slowed(tree, 5.0):
            result = _chaos_trial(tree, seed, kills=6, stages=stages, interval_s=(0.3, 1.5))
        assert result["statuses"][-1] == "succeeded", result
        assert_run_exact(tree, keys, bad)
        results.append(result)
    print("chaos trials:", [(r["seed"], r["kills"], r["statuses"]) for r in results])
    assert sum(len(r["kills"]) for r in results) >= 4, "the kills should land mid-run"


@pytest.mark.slow
def test_operator_mistakes_inserted_line_renamed_input_edited_prompt(
        ray_cluster, s3_endpoint, tmp_path, caplog):
    first = write_prompts(tmp_path / "a.jsonl", 24, extra_lines=BAD)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(first))
    assert run(tree).status == "succeeded"
    assert_run_exact(tree, keys_of(first), BAD)
    assert store_of(tree).read_json("inputs.json")["files"][0]["rows"] == 26

    # 1. a line inserted at the top (every line number moves) and 2. the file renamed:
    # the bad lines are not rejected again, no valid row is skipped, nothing redone
    lines = first.read_text().splitlines()
    moved = tmp_path / "moved" / "b.jsonl"
    moved.parent.mkdir()
    new_row = json.dumps({"id": "inserted", "messages": [{"role": "user", "content": "new"}]})
    moved.write_text("\n".join([new_row] + lines) + "\n")
    first.unlink()
    tree["job"]["input"] = str(moved)
    again = run(tree)
    assert again.progress["session_rows"] == 1 and again.progress["rejected"] == len(BAD)
    assert_run_exact(tree, keys_of(moved), BAD)

    # 3. a prompt edited under an id already done: said, and the earlier output kept
    caplog.set_level(logging.WARNING, logger="raygen")
    edited = [json.dumps({"id": "p00002", "messages": [{"role": "user", "content": "edited"}]})
              if '"p00002"' in x else x for x in moved.read_text().splitlines()]
    moved.write_text("\n".join(edited) + "\n")
    third = run(tree)
    assert third.progress["session_rows"] == 0
    assert "1 prompts were edited under an id already done" in caplog.text
    assert "p00002" in caplog.text and f"input {moved} changed" in caplog.text
    data = read(tree, "data")
    assert "Prompt 2:" in data.set_index("key").loc["p00002", "messages"]
    assert data["prompt_hash"].notna().all()


@pytest.mark.slow
def test_context_overflow_is_sent_again_after_a_context_change(ray_cluster, s3_endpoint,
                                                              tmp_path):
    # prompt alone fits (~13K of 16384) but not with the 4096 budget: policy reject refuses
    long_row = json.dumps({"id": "long", "messages": [{"role": "user", "content": "y" * 13000}]})
    rows = write_prompts(tmp_path / "p.jsonl", 6, extra_lines=[long_row])
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows))
    first = run(tree)
    failures = read(tree, "failures")
    assert list(failures.key) == ["long"] and failures.error_class[0] == "context_overflow"
    assert first.progress["failed"] == 1 and read(tree, "rejects").empty
    assert run(tree).progress["session_rows"] == 0  # a plain rerun leaves it alone

    # The policy is in settings_hash (switching it is refused); the context length is not.
    # It is in the engine's hash: the longer context is an app of its own (one replica),
    # so the shared app is not redeployed for it, and back again by the next test.
    tree["engine"]["context_length"] = 32768
    tree["serve"].update(app_name="raygen-context-32k",
                         autoscaling={"min_replicas": 1, "max_replicas": 1,
                                      "target_ongoing_requests": 32})
    retried = run(tree, retry_failed=True)
    assert retried.progress["failed"] == 0 and retried.progress["completed"] == 7
    data = read(tree, "data").set_index("key")
    assert data.loc["long", "budget_clamped_by"] == ""  # the whole budget, now it fits
    assert_run_exact(tree, keys_of(rows))


def test_a_row_dropped_between_admission_and_read_fails_the_run(ray_cluster, s3_endpoint,
                                                                 tmp_path, monkeypatch):
    """The input file changes after the driver's admission pass chose its rows (an
    exporter still writing it, a copy replaced): the read stage no longer finds one
    chosen row. The session must end failed, naming the prompts without a result, not
    "succeeded" with a row silently missing."""
    from jobs.runs import plans
    rows = write_prompts(tmp_path / "p.jsonl", 40)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows))
    real_admit = plans.admit

    def admit_then_edit(*args, **kwargs):
        admission = real_admit(*args, **kwargs)
        lines = rows.read_text().splitlines()
        lines[7] = json.dumps({"id": "p00007-renamed", "messages": [
            {"role": "user", "content": "edited after the admission pass"}]})
        rows.write_text("\n".join(lines) + "\n")
        return admission
    monkeypatch.setattr(plans, "admit", admit_then_edit)
    from jobs.runs.run import RunError
    with pytest.raises(RunError, match="1 of 40 prompts have no result"):
        run(tree)
    assert store_of(tree).read_json("progress.json")["status"] == "failed"
    assert len(read(tree, "data")) == 39
