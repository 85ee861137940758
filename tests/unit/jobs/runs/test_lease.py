"""jobs.runs.lease on local files (tests/integration/test_operator_safety.py runs it on S3
with real drivers): one holder, a refusal naming it, takeover only once stale."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jobs.config import StorageConfig
from jobs.runs.lease import LeaseHeld, RunLease, read_holder
from jobs.io.run_store import RunStore
from tests.support.waiting import wait_until


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(str(tmp_path / "run"), StorageConfig())


def test_second_driver_is_refused_with_the_holder_named(store):
    first = RunLease(store, timeout_s=60).acquire()
    try:
        with pytest.raises(LeaseHeld) as info:
            RunLease(store, timeout_s=60).acquire()
        msg = str(info.value)
        assert first.me.job_id in msg and first.me.host in msg and first.me.since in msg
        assert f"pid {first.me.pid}" in msg and "job.lease_timeout_s=60" in msg
        assert read_holder(store).token == first.me.token
    finally:
        first.release()
    assert read_holder(store) is None  # released: the next job starts at once
    RunLease(store, timeout_s=60).acquire().release()


def test_stale_lease_is_taken_over_and_said(store):
    holder = RunLease(store, timeout_s=60).acquire()
    holder._stop.set()  # a SIGKILLed driver: no more renewals, no release
    lease_file = Path(store.loc("lease.json").path)
    stale = dict(json.loads(lease_file.read_text()), renewed_at=time.time() - 61)
    lease_file.write_text(json.dumps(stale))
    taker = RunLease(store, timeout_s=60).acquire()
    try:
        assert taker.takeover and holder.me.job_id in taker.takeover
        assert "not renewed for 61 s > job.lease_timeout_s=60" in taker.takeover
        assert read_holder(store).token == taker.me.token
    finally:
        taker.release()


def test_renewal_keeps_the_lease_and_a_lost_lease_is_noticed(store, monkeypatch):
    interrupted = []
    monkeypatch.setattr("_thread.interrupt_main", lambda: interrupted.append(True))
    lease = RunLease(store, timeout_s=0.3).acquire()
    first = read_holder(store).renewed_at
    wait_until(lambda: read_holder(store).renewed_at != first, 10, "the lease's renewal")
    assert read_holder(store).renewed_at > first  # renewed by its thread
    lease_file = Path(store.loc("lease.json").path)  # another job takes it (e.g. after a stall)
    lease_file.write_text(json.dumps(dict(json.loads(lease_file.read_text()), token="other")))
    wait_until(lambda: interrupted, 10, "the driver to be interrupted")
    assert interrupted and "taken over" in lease.lost  # the driver is told to stop
    lease.release()
    assert read_holder(store).token == "other"  # and never deletes the taker's lease


def test_holder_is_named_by_the_ray_job_submission_id(monkeypatch):
    from jobs.runs.lease import this_driver
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(
        {"runtime_env": {}, "metadata": {"job_submission_id": "raysubmit_abc"}}))
    assert this_driver().job_id == "raysubmit_abc"
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    assert this_driver().job_id.startswith("driver-")


def test_a_dead_driver_on_this_host_is_taken_over_at_once(store):
    # Above the kernel's pid_max: a pid no process on this host can have.
    gone_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    holder = RunLease(store, timeout_s=600).acquire()
    holder._stop.set()
    lease_file = Path(store.loc("lease.json").path)
    lease_file.write_text(json.dumps(dict(json.loads(lease_file.read_text()), pid=gone_pid)))
    taker = RunLease(store, timeout_s=600).acquire()  # fresh (renewed now), yet taken
    try:
        assert f"(pid {gone_pid} on this host) is gone" in taker.takeover
    finally:
        taker.release()


def test_a_fresh_lease_of_another_host_is_never_judged_by_pid(store):
    holder = RunLease(store, timeout_s=600).acquire()
    holder._stop.set()
    lease_file = Path(store.loc("lease.json").path)
    lease_file.write_text(json.dumps(dict(json.loads(lease_file.read_text()),
                                          host="other-node", pid=2 ** 22 + 7)))
    with pytest.raises(LeaseHeld, match="other-node"):
        RunLease(store, timeout_s=600).acquire()
