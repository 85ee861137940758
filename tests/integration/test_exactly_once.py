"""Exactly-once runs: SIGKILL the driver at random moments and resume; kill an engine
mid-run; transient errors retried; permanent ones kept in failures/ and cleared by
--retry-failed; the breaker; malformed input into rejects/; progress == output."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

from jobs.runs.run import RunError
from tests.integration.helpers import SLOW_ENGINE, run_config, write_prompts
from tests.integration.helpers import (CLEAR_FAULTS, deploy, engine_urls, generate_cmd, read,
                                       run, run_with_faults, set_faults, slowed, store_of,
                                       write_yaml)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
APP = "raygen-test"


def _assert_exactly_once(tree: dict, n: int) -> None:
    data = read(tree, "data")
    failures = read(tree, "failures")
    assert len(data) == n, (f"expected {n} rows, got {len(data)}; failures: "
                            f"{failures[['error_class', 'error_message']].head(3).to_dict('records')}")
    assert data["key"].is_unique
    assert sorted(data["id"]) == [f"p{i:05d}" for i in range(n)]


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume(ray_cluster, s3_endpoint, tmp_path):
    """Each trial SIGKILLs a driver subprocess in one phase of its run, at a random moment
    inside it, then resumes the run once: exact. The phases are found by watching the
    run, not the clock since launch (a kill during the interpreter's imports, seconds on
    a loaded machine, proves nothing): admission and pipeline start (the driver has just
    taken the lease), the first durable parts, and half the rows durable."""
    rows = write_prompts(tmp_path / "p.jsonl", 240)
    rng = random.Random(7)

    def completed(store) -> int:
        return (store.read_json("progress.json") or {}).get("completed", 0)

    # Each phase with the slowdown that keeps the run going past it: 25x for the early
    # phases (a few seconds to reach them), 4x for half done (its first half, slowed 25x,
    # took ~40 s; at 4x the second half still outlasts the kill's 1.5 s by seconds).
    phases = {"start": (lambda store: store.read_json("lease.json"), 25.0),
              "first parts": (lambda store: completed(store) > 0, 25.0),
              "half done": (lambda store: completed(store) >= 120, 4.0)}
    landed = []
    for trial, (phase, (reached, slowdown)) in enumerate(phases.items()):
        tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                          run_name=f"kill-{trial}-{os.getpid()}",
                          job={"rows_per_file": 16, "batch_size": 8})
        store = store_of(tree)
        cmd = generate_cmd(tmp_path / f"kill{trial}.yaml", tree)
        with slowed(tree, slowdown):  # mid-run at the phase's moment; the resume at full speed
            first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_until(lambda: reached(store) or first.poll() is not None, 180, phase)
            try:
                first.wait(timeout=rng.uniform(0.0, 1.5))
            except subprocess.TimeoutExpired:
                first.send_signal(signal.SIGKILL)
            first.wait()
        durable = completed(store)
        landed.append(first.returncode == -signal.SIGKILL and durable < 240)
        # The resume in this process: the kill is what needs a driver of its own (and
        # an interpreter start saved per trial)
        assert run(tree).status == "succeeded"
        _assert_exactly_once(tree, 240)
        print(f"trial {trial} ({phase}): killed={landed[-1]} with {durable} rows durable")
    assert sum(landed) >= 2, f"the kills should land mid-run: {landed}"


def test_engine_killed_mid_run_loses_nothing(ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 200)
    # Parts of 16 and 32 rows in flight: rows turn durable in waves, so the kill after the
    # first ones lands mid-run (with 96 in flight and parts of 64, all 200 once became
    # durable between two polls).
    # The suite's retries (3 attempts, 0.05-0.2 s apart) and health checks every 4 s:
    # Serve replaces the replica ~12 s after the kill, long after a row refused at once
    # has spent its attempts. The replica holds rows while its engine is dead (serve_apps/
    # engine_deployment.py): with rows refused at once, this trial needed 8 attempts
    # 0.5-3 s apart, and the soak's kill of one engine of two ended its session (54% of a
    # 200-row window failed, the breaker tripped).
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"rows_per_file": 16, "batch_size": 8, "inflight_rows_per_actor": 32},
                      serve={"health_check_period_s": 4},
                      engine=SLOW_ENGINE, app_name="raygen-enginekill")
    from ray import serve

    store = store_of(tree)
    at_kill = {}

    def kill_one_engine():  # once rows are durable: mid-run
        at_kill["completed"] = wait_until(
            lambda: (store.read_json("progress.json") or {}).get("completed", 0), 120,
            "the first durable rows")
        info = serve.get_app_handle("raygen-enginekill").info.remote().result()
        os.killpg(info["engine_pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_one_engine)
    killer.start()
    summary = run(tree)
    killer.join()
    print(f"engine killed with {at_kill['completed']} of 200 rows durable")
    assert 0 < at_kill["completed"] < 200, "the kill must land mid-run"
    assert summary.status == "succeeded"
    _assert_exactly_once(tree, 200)
    assert read(tree, "failures").empty
    serve.delete("raygen-enginekill")


def test_transient_errors_are_retried(ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 80)
    # 12 tries at a 30% fault rate: a row fails all of them with p = 0.3^12, 4e-5 in a
    # run of 80 (with 8 tries 0.5%: CI once lost one).
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"retries": {"max_attempts": 12}})
    summary = run_with_faults(tree, APP, error_rate=0.3, error_status=503)
    assert summary.status == "succeeded"
    data = read(tree, "data")
    _assert_exactly_once(tree, 80)
    assert (data["attempts"] > 1).any(), "some rows should have needed a retry"
    assert read(tree, "failures").empty


def test_permanent_errors_land_in_failures_and_retry_failed_clears_them(
        ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 60)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows))
    deploy(tree)
    urls = engine_urls(APP, 2)
    try:
        set_faults(urls, error_rate=0.5, error_status=400)
        first = run(tree)
    finally:
        set_faults(urls, **CLEAR_FAULTS)
    failures = read(tree, "failures")
    data = read(tree, "data")
    assert first.progress["failed"] == len(failures) > 0
    assert set(failures.key).isdisjoint(data.key), "a failed row must never look done"
    assert (failures.error_class == "bad_request").all() and (failures.attempts == 1).all()
    assert failures["line"].notna().all() and failures["error_message"].str.contains("400").all()
    assert len(data) + len(failures) == 60

    plain_rerun = run(tree)  # failures stay failures until asked
    assert plain_rerun.progress["session_rows"] == 0
    retried = run(tree, retry_failed=True)
    assert retried.progress["failed"] == 0 and retried.progress["completed"] == 60
    assert retried.progress["session_retried_failures"] == failures.key.nunique()
    _assert_exactly_once(tree, 60)


def test_breaker_stops_the_job_when_every_engine_fails(ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 200)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"breaker": {"window_rows": 20, "min_rows": 10,
                                       "max_failure_fraction": 0.5},
                           "retries": {"max_attempts": 2}})
    deploy(tree)
    urls = engine_urls(APP, 2)
    try:
        set_faults(urls, error_rate=1.0, error_status=500)
        with pytest.raises(RunError, match="engine fleet looks down"):
            run(tree)
    finally:
        set_faults(urls, **CLEAR_FAULTS)
    assert read(tree, "data").empty
    assert len(read(tree, "failures")) < 200, "the breaker must stop before the whole dataset"
    progress = store_of(tree).read_json("progress.json")
    assert progress["status"] == "failed"


def test_malformed_rows_are_rejected_and_valid_rows_complete(ray_cluster, s3_endpoint,
                                                             tmp_path):
    long_prompt = json.dumps({"id": "too-long", "messages": [
        {"role": "user", "content": "x" * 20000}]})
    bad = ['{"id": "broken", "messages": [', '["not", "an", "object"]',
           '{"id": "nomsg"}', '{"id": "empty", "messages": []}',
           '{"id": "role", "messages": [{"role": "bot", "content": "hi"}]}',
           '{"id": "content", "messages": [{"role": "user", "content": ["a"]}]}',
           '{"id": 1.5, "messages": [{"role": "user", "content": "hi"}]}',
           '{"id": "p00003", "messages": [{"role": "user", "content": "dup"}]}',
           long_prompt]
    rows = write_prompts(tmp_path / "p.jsonl", 30, extra_lines=bad)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows))
    summary = run(tree)
    assert summary.status == "succeeded"
    _assert_exactly_once(tree, 30)
    rejects = read(tree, "rejects").sort_values("line")
    assert list(rejects.line) == list(range(31, 30 + len(bad)))
    expected = ["not valid JSON", "must be a JSON object", "missing 'messages'",
                "'messages' is empty", "messages[0].role 'bot'", "messages[0].content[0]: part type 'str' is not supported",
                "id must be a string", "duplicate id 'p00003': first seen at"]
    for reason, want in zip(rejects.reason, expected):
        assert want in reason, (want, reason)
    assert rejects.reject_id.is_unique
    # too long for the context: a failure (not a reject), so --retry-failed can resend it
    failures = read(tree, "failures")
    assert list(failures.key) == ["too-long"]
    assert failures.error_class[0] == "context_overflow"
    assert summary.progress["rejected"] == len(bad) - 1 and summary.progress["failed"] == 1
    again = run(tree)  # rejects are not redone or duplicated on resume
    assert again.progress["session_rows"] == 0 and len(read(tree, "rejects")) == len(bad) - 1


def test_sigterm_stops_cleanly_and_resume_finishes(ray_cluster, s3_endpoint, tmp_path):
    """`ray job stop` sends SIGTERM: status becomes "stopped", written rows stay."""
    rows = write_prompts(tmp_path / "p.jsonl", 240)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"rows_per_file": 16, "batch_size": 8})
    cfg = write_yaml(tmp_path / "term.yaml", tree)
    cmd = [sys.executable, "-m", "jobs.generate", "--config", str(cfg)]
    log = open(tmp_path / "driver.log", "w")
    store = store_of(tree)
    killed = False
    # As fast as the slow app's engines (5x slower than these): the stop lands mid-run
    # with rows in flight; the resume runs at full speed.
    with slowed(tree, 5.0):
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: (store.read_json("progress.json") or {}).get("completed", 0), 120,
                   "some rows to be durable")
        proc.send_signal(signal.SIGTERM)
        try:  # as `ray job stop` does: SIGKILL 3 s after SIGTERM
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            killed = True
        assert proc.wait(timeout=120) != 0
    stopped = store.read_json("progress.json")
    assert stopped["status"] == "stopped" and 0 < stopped["completed"] < 240
    if not killed:  # it had time for the final rescan (else counts are the last snapshot's)
        assert stopped["completed"] == len(read(tree, "data"))
    assert store.read_json("lease.json") is None  # released first too: resume at once
    from jobs.analysis.finalize import FinalizeError, finalize
    with pytest.raises(FinalizeError, match="not complete .last status stopped"):
        finalize(store)  # a stopped run is not finalized as if complete
    assert run(tree).status == "succeeded"  # the resume in this process
    _assert_exactly_once(tree, 240)
    assert finalize(store)["complete"] is True


def test_check_context_counts_prompts_short_of_their_budget(ray_cluster, s3_endpoint,
                                                            tmp_path):
    lines = [json.dumps({"id": f"long{i}", "messages": [
        {"role": "user", "content": "y" * (9000 + 2000 * i)}]}) for i in range(3)]
    rows = write_prompts(tmp_path / "p.jsonl", 20, extra_lines=lines + ['{"broken'])
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"max_new_tokens": 8192})
    summary = run(tree, check_context=True)
    report = summary.progress
    assert report["prompts"] == 23 and report["context_length"] == 16384
    # 9000+ character prompts are 9000+ tokens: 9000 + 8192 > 16384 for all three; the
    # longest (13000) still fits alone.
    assert report["short_of_full_budget"] == 3 and report["prompt_alone_too_long"] == 0
    # + SGLang's speculative reserve (NEXTN 3/1/4: 4 tokens) on top of prompt + budget.
    assert report["context_needed_for_all"] == report["prompt_tokens_max"] + 8192 + 4
    assert store_of(tree).read_json("context_check.json") == report
    assert read(tree, "data").empty  # a check generates nothing
    assert "3 prompts cannot get their full budget" in summary.text
