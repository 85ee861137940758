"""jobs.runs.lease and its back end jobs.io.lease_store on local files
(tests/integration/test_operator_safety.py runs them on S3 with real drivers): one
holder, a refusal naming it, takeover only once stale."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from jobs.config import StorageConfig
from jobs.io.lease_store import read_holder
from jobs.runs.lease import LeaseHeld, RunLease
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


def _age_on_the_store(store, seconds: float, **fields) -> None:
    """The lease as a driver that stopped renewing `seconds` ago left it: its file's
    mtime (the store's clock) that old; ``fields`` overwrite what the holder wrote."""
    lease_file = Path(store.loc("lease.json").path)
    lease_file.write_text(json.dumps(dict(json.loads(lease_file.read_text()), **fields)))
    then = time.time() - seconds
    os.utime(lease_file, (then, then))


def test_stale_lease_is_taken_over_and_said(store):
    holder = RunLease(store, timeout_s=60).acquire()
    holder._stop.set()  # a SIGKILLed driver: no more renewals, no release
    _age_on_the_store(store, 61.5)
    taker = RunLease(store, timeout_s=60).acquire()
    try:
        assert taker.takeover and holder.me.job_id in taker.takeover
        # 61.5 s old when written; a loaded machine may take a second more to read it
        age = re.search(r"not renewed for (\d+) s > job.lease_timeout_s=60 s", taker.takeover)
        assert age and 61 <= int(age.group(1)) <= 70, taker.takeover
        assert read_holder(store).token == taker.me.token
    finally:
        taker.release()


def test_staleness_is_judged_by_the_stores_clock_not_the_holders(store):
    """A holder whose clock runs an hour ahead wrote renewed_at in the future: the store
    says its lease is old, so it is taken over; one whose clock is an hour behind is
    still fresh by the store and is not."""
    holder = RunLease(store, timeout_s=60).acquire()
    holder._stop.set()
    _age_on_the_store(store, 0, renewed_at=time.time() - 3600)  # clock behind, yet fresh
    with pytest.raises(LeaseHeld):
        RunLease(store, timeout_s=60).acquire()
    _age_on_the_store(store, 90, renewed_at=time.time() + 3600)  # clock ahead, yet stale
    taker = RunLease(store, timeout_s=60).acquire()
    try:
        assert "not renewed for 90 s" in taker.takeover
    finally:
        taker.release()


class FlakyStore:
    """A lease backend around the real one: renewals time out, or their reply is lost."""

    def __init__(self, inner, mode: str):
        self.inner, self.mode, self.age_s = inner, mode, None
        self.failed = False
        self.replies: list[tuple[float, float]] = []  # "slow": (sent, answered)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def replace(self, body, version):
        if self.mode == "unreachable" or (self.mode == "one-hiccup" and not self.failed):
            self.failed = time.monotonic()
            raise OSError("connect timeout")
        if self.mode == "slow":
            sent = time.monotonic()
            time.sleep(0.4)
            version = self.inner.replace(body, version)
            self.replies.append((sent, time.monotonic()))
            return version
        if self.mode == "reply-lost":  # the write happens, the client sees a 412 on retry
            self.inner.replace(body, version)
            from jobs.io.lease_store import LeaseConflict
            raise LeaseConflict("PreconditionFailed")
        return self.inner.replace(body, version)


def test_a_driver_that_cannot_renew_is_fenced_after_three_quarters_of_the_timeout(store, monkeypatch):
    lease = RunLease(store, timeout_s=0.6).acquire()
    stops: list[str] = []
    lease.on_fence = stops.append  # not the session's interrupt of this thread
    try:
        assert lease.fenced() is None
        lease.backend = FlakyStore(lease.backend, "unreachable")
        wait_until(lambda: stops, 10, "the fence")
        assert "could not be renewed for" in lease.fenced() and not lease.lost
        assert len(stops) == 1 and "could not be renewed for" in stops[0]  # stopped once
    finally:
        lease.release()


def test_an_outage_past_half_the_timeout_is_ridden_out_and_three_quarters_fences(store):
    # A store outage every client sees is not a takeover: nobody can take the lease
    # before the whole timeout, so the fence waits for 3/4 of it (it closed at half: a
    # 30 s S3 outage late in a renewal interval ended a run on the 120 s default).
    lease = RunLease(store, timeout_s=600).acquire()
    try:
        lease.renewed = time.monotonic() - 0.70 * 600
        assert lease.fenced() is None
        lease.renewed = time.monotonic() - 0.76 * 600
        assert "more than 3/4 of job.lease_timeout_s=600 s" in lease.fenced()
    finally:
        lease.renewed = time.monotonic()
        lease.release()


def test_a_renewal_is_timed_from_when_it_was_sent(store):
    # The store wrote the lease no earlier than the request left: a renewal whose reply
    # took long must not count as fresher than it is.
    lease = RunLease(store, timeout_s=0.9).acquire()
    try:
        slow = lease.backend = FlakyStore(lease.backend, "slow")
        wait_until(lambda: slow.replies, 10, "a slow renewal")
        renewed, replies = lease.renewed, list(slow.replies)  # renewed is set after a reply
        assert all(answered - sent >= 0.4 for sent, answered in replies)
        assert min(abs(renewed - sent) for sent, _ in replies) < 0.05, (renewed, replies)
    finally:
        lease.release()


def test_one_failed_renewal_is_retried_within_seconds_not_fenced(store, monkeypatch):
    # A renewal every third of the timeout, the fence at 3/4 of it: a single failed
    # renewal waiting a full period for its retry would fence a healthy run.
    monkeypatch.setattr("jobs.runs.lease.RETRY_S", 0.05)
    lease = RunLease(store, timeout_s=3.0).acquire()
    try:
        flaky = lease.backend = FlakyStore(lease.backend, "one-hiccup")
        first = read_holder(store).renewed_at
        wait_until(lambda: flaky.failed and read_holder(store).renewed_at > first, 10,
                   "a renewal after the failed one")
        assert lease.renewed - flaky.failed < 0.5, "retried a whole period (1 s) later"
        assert lease.fenced() is None
    finally:
        lease.release()


def test_a_renewal_whose_reply_was_lost_is_not_a_takeover(store, monkeypatch):
    interrupted = []
    monkeypatch.setattr("_thread.interrupt_main", lambda: interrupted.append(True))
    lease = RunLease(store, timeout_s=0.3).acquire()
    lease.backend = FlakyStore(lease.backend, "reply-lost")
    first = read_holder(store).renewed_at
    wait_until(lambda: read_holder(store).renewed_at > first + 0.2, 10, "two renewals")
    assert not interrupted and lease.lost is None and lease.fenced() is None
    lease.release()
    assert read_holder(store) is None  # still ours to release


def test_a_store_that_ignores_conditional_writes_is_refused(store):
    from jobs.runs.lease import UnsafeStore

    class Ignoring:
        def honours_conditions(self):
            return False
    lease = RunLease(store, timeout_s=60)
    lease.backend = Ignoring()
    with pytest.raises(UnsafeStore, match="does not honour conditional writes"):
        lease.acquire()


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


def test_the_stores_age_of_a_lease_reads_any_http_date_or_says_nothing():
    # An S3 answer's Date against its LastModified (botocore: aware, UTC). A proxy that
    # adds its own Date joins the two headers, and "-0000" reads naive too: before, the
    # naive date raised TypeError in the lease's first read and no resume could start
    # behind such a proxy (bench/soak.py's driver kill, through bench/s3_faults.py).
    from datetime import datetime, timezone

    from jobs.io.lease_store import _store_age
    modified = datetime(2026, 12, 7, 7, 49, 0, tzinfo=timezone.utc)

    def age(date):
        return _store_age({"ResponseMetadata": {"HTTPHeaders": {"date": date}},
                           "LastModified": modified})
    assert age("Mon, 07 Dec 2026 07:49:20 GMT") == 20
    assert age("Mon, 07 Dec 2026 07:49:20 -0000") == 20
    assert age("Mon, 07 Dec 2026 07:49:20 GMT, Mon, 07 Dec 2026 07:49:21 GMT") == 20
    assert age("Mon, 07 Dec 2026 08:49:20 +0100") == 20
    assert age("not a date") is None
    assert age(None) is None
    assert _store_age({"ResponseMetadata": {"HTTPHeaders": {"date": "x"}}}) is None
