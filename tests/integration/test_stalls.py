"""No hang outlives its cause: real processes SIGSTOPped mid-run.

- A stopped generate actor: no part becomes durable; the watchdog ends the session as
  `stalled` (exit 1) within its limit, names the stuck task, releases the lease; the
  rerun is exact.
- A stopped engine: its replica fails Serve's health checks and is replaced (the stopped
  processes are killed, none is left); the rows it held are retried elsewhere and the run
  completes exactly.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from jobs.runs.run import RunError
from tests.integration.helpers import (SLOW_APP, SLOW_ENGINE, assert_run_exact, read, run,
                                       run_config, store_of, write_prompts)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 240


def _children_named(marker: str, app: str = "") -> list[psutil.Process]:
    """This test session's processes whose command line starts with ``marker`` after the
    interpreter (the local Ray cluster, its workers and their engines all run below this
    process; a guard's command line only contains its engine's). With ``app``, only those
    below a replica of that Serve app: the shared cluster still runs earlier tests' apps."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            owners = [" ".join(parent.cmdline()) for parent in proc.parents()]
        except psutil.Error:
            continue
        if not (cmd.startswith(marker) or cmd.split(" ", 1)[-1].startswith(marker)):
            continue
        if app and not any(owner.startswith(f"ray::ServeReplica:{app}:") for owner in owners):
            continue
        found.append(proc)
    return found


def _stop_when_durable(store, marker: str, seen: dict, app: str = "") -> threading.Thread:
    def stop_one():
        seen["completed"] = wait_until(
            lambda: (store.read_json("progress.json") or {}).get("completed", 0), 180,
            "the first durable rows")
        (proc,) = _children_named(marker, app)[:1]
        seen["pid"], seen["at"] = proc.pid, time.monotonic()
        proc.send_signal(signal.SIGSTOP)
    thread = threading.Thread(target=stop_one)
    thread.start()
    return thread


def test_a_stopped_generate_actor_ends_the_session_as_stalled(ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", ROWS)
    # The shared slow app: this trial stops a generate actor, not an engine.
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name=SLOW_APP,
                      engine=SLOW_ENGINE,
                      job={"rows_per_file": 16, "batch_size": 8, "inflight_rows_per_actor": 32,
                           "stall_min_s": 8, "stall_factor": 3, "lease_timeout_s": 30})
    store, seen = store_of(tree), {}
    stopper = _stop_when_durable(store, "ray::MapWorker(MapBatches(GenerateRows))", seen)
    try:
        with pytest.raises(RunError) as info:
            run(tree)
        ended = time.monotonic()
    finally:
        stopper.join()
        if "pid" in seen:  # Ray kills the actor with the job; SIGCONT in case it did not
            try:
                os.kill(seen["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass
    message = str(info.value).split("\n")[0]
    print(f"\nwatchdog: {message}")
    assert message.startswith("stalled: no row became durable"), message
    assert "MapBatches(GenerateRows)" in message  # the stopped actor's task, named
    assert 0 < seen["completed"] < ROWS
    assert ended - seen["at"] < 90, "the watchdog must end the session within its limit"
    progress = store.read_json("progress.json")
    assert progress["status"] == "stalled"
    assert store.read_json("lease.json") is None  # released: a resubmit can start at once
    # The rerun finishes the run exactly.
    assert run(tree).status == "succeeded"
    assert_run_exact(tree, [f"p{i:05d}" for i in range(ROWS)])


def test_a_stopped_engine_is_replaced_and_the_run_completes_exactly(ray_cluster, s3_endpoint,
                                                                     tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", ROWS)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name="raygen-stopped-engine",
                      engine={"simulator": {"time_scale": 0.01}, "request_timeout_s": 20},
                      job={"rows_per_file": 16, "batch_size": 8,
                           "retries": {"max_attempts": 8, "backoff_initial_s": 0.5,
                                       "backoff_max_s": 3}})
    store, seen = store_of(tree), {}
    stopper = _stop_when_durable(store, "-m serve_apps.engines.simulator", seen,
                                 app="raygen-stopped-engine")
    try:
        summary = run(tree)
    finally:
        stopper.join()
    assert 0 < seen["completed"] < ROWS
    assert summary.status == "succeeded"
    assert_run_exact(tree, [f"p{i:05d}" for i in range(ROWS)])
    assert read(tree, "failures").empty
    # The stopped engine did not survive its replica: no stopped process is left.
    wait_until(lambda: not psutil.pid_exists(seen["pid"]) or
               psutil.Process(seen["pid"]).status() == psutil.STATUS_ZOMBIE, 60,
               f"the stopped engine {seen['pid']} to be killed with its replica")
