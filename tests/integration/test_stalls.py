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
from tests.integration.helpers import (assert_run_exact, read, run, run_config, slowed,
                                       store_of, write_prompts)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 240
STALL_ROWS = 160  # the stalled session's: its rerun is the rest, at full speed


def _children_named(marker: str, app: str = "") -> list[psutil.Process]:
    """This test session's processes whose command line starts with ``marker`` after the
    interpreter (the local Ray cluster, its workers and their engines all run below this
    process; a guard's command line only contains its engine's). With ``app``, only those
    below a replica of that Serve app: the shared cluster still runs earlier tests' apps."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            if not (cmd.startswith(marker) or cmd.split(" ", 1)[-1].startswith(marker)):
                continue
            # the owners only of a match: a loaded machine is slow to read every process's
            owners = [" ".join(parent.cmdline()) for parent in proc.parents()] if app else []
        except psutil.Error:
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
    rows = write_prompts(tmp_path / "p.jsonl", STALL_ROWS)
    # The shared fast app, its engines slowed (helpers.slowed, 25x: a row takes ~1-2 s)
    # only while the session to be stalled runs, and 16 rows in flight: generation is
    # slower than the writes (~10 rows/s; at 32 in flight, 25x, a loaded machine had 144
    # rows generated ahead of the writes at the stop, ~15 s of parts still to become
    # durable before the watchdog's silence began), the actor is stopped with most rows
    # still to generate (~12 s of them, against a few seconds from the first durable part
    # to the stop), and the rerun runs at full speed. The watchdog's limit is
    # stall_factor x the first gap (session start to the first durable part, mostly the
    # session's start-up): 1.5x, not 3x, as no later gap comes near it before the stop.
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"rows_per_file": 16, "batch_size": 8, "inflight_rows_per_actor": 16,
                           "stall_min_s": 8, "stall_factor": 1.5, "lease_timeout_s": 30})
    store, seen = store_of(tree), {}
    with slowed(tree):
        stopper = _stop_when_durable(store, "ray::MapWorker(MapBatches(GenerateRows))", seen)
        try:
            with pytest.raises(RunError) as info:
                run(tree)
            ended = time.monotonic()
        finally:
            stopper.join()
            if "pid" in seen:  # Ray kills the actor with the pool; SIGCONT in case it did not
                try:
                    os.kill(seen["pid"], signal.SIGCONT)
                except ProcessLookupError:
                    pass
    message = str(info.value).split("\n")[0]
    print(f"\nwatchdog: {message} (stopped at {seen['completed']} durable rows, the session "
          f"ended {ended - seen['at']:.0f} s later)")
    assert message.startswith("stalled: no row became durable"), message
    assert "MapBatches(GenerateRows)" in message  # the stopped actor's task, named
    assert 0 < seen["completed"] < STALL_ROWS
    assert ended - seen["at"] < 90, "the watchdog must end the session within its limit"
    progress = store.read_json("progress.json")
    assert progress["status"] == "stalled"
    assert store.read_json("lease.json") is None  # released: a resubmit can start at once
    # The rerun finishes the run exactly.
    assert run(tree).status == "succeeded"
    assert_run_exact(tree, [f"p{i:05d}" for i in range(STALL_ROWS)])


def test_a_stopped_engine_is_replaced_and_the_run_completes_exactly(ray_cluster, s3_endpoint,
                                                                     tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", ROWS)
    # Its own app (the engine it stops is replaced). The stopped engine's replica is stopped
    # by Serve after its in-flight rows get graceful_shutdown_timeout_s (they never finish
    # on a stopped engine): 2 s, not Serve's 20 s, before they are retried elsewhere.
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name="raygen-stopped-engine",
                      engine={"simulator": {"time_scale": 0.01}, "request_timeout_s": 20},
                      serve={"graceful_shutdown_timeout_s": 2},
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
