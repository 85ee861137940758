"""One job per run: ``<run>/lease.json`` names the driver that holds the run.

Four drivers on one run generated 3.7x the GPU work and wrote duplicated (key,
version) rows while each printed "succeeded". So a driver takes the run's lease before
it writes anything, renews it every third of ``lease_timeout_s`` (at most every
minute) from a thread, and deletes it when it ends. A second driver finds a fresh lease and refuses, naming the holder
(Ray job submission id if any, host, pid, since). A lease not renewed for
``job.lease_timeout_s`` (the holder was SIGKILLed, its node lost) is taken over, and
the takeover is said.

Every write is conditional, so two drivers cannot both win (the S3 and local back
ends, and the lease's format ``Holder``, are jobs/io/lease_store.py).

Staleness is judged by the store's clock, not the holder's: the age of a lease is the
store's time now (S3: the response's Date; locally: the mtime of a file just touched
beside it) minus the lease object's last modification (LastModified / mtime), so a
holder whose clock is off can neither block the run nor lose it early. A holder on this
very host whose pid is dead (a SIGKILLed driver resubmitted where it ran) is taken over
at once; a reused pid only makes us wait for the timeout.

The lease fences its holder: ``fenced()`` is true once the lease is seen lost (taken
over), or once the last good renewal (timed from when its request was sent: the store
wrote it no earlier) is older than three quarters of the timeout, the quarter left being
the margin for writes already under way. A renewal that cannot reach the store fails
within seconds (the lease's own S3 client has short timeouts and two tries) and is tried
again every few seconds. The fence used to close at half the timeout: a 30 s S3 outage
late in a renewal interval ended a run whose lease nobody could take for another
minute. An outage every client sees is not a takeover: a driver rides out outages up to
3/4 of the timeout less one renewal interval (at the 600 s default, ~6 minutes: what a
real S3 incident lasts; the store calls themselves are retried for
``storage.s3_retry_window_s``), and only then stops. A fenced session stops
dispatching, and a driver that lost its lease writes nothing more (no progress.json,
report or release over the next holder's). A renewal answered 412
is first read back: when the lease still carries our token (our own write, retried by
the SDK after its reply was lost), it is ours and the session goes on. Once per run the
store is checked to honour conditional writes (a second If-None-Match create must fail):
a store that ignores them could let two jobs write one run, and is refused.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict
from typing import Optional

from jobs.io.lease_store import Holder, LeaseConflict, lease_backend

logger = logging.getLogger("raygen")


class LeaseHeld(RuntimeError):
    """Another live job holds the run."""


class UnsafeStore(RuntimeError):
    """The store does not honour conditional writes: the lease could not fence."""


RETRY_S = 5.0  # the wait before the next try after a renewal failed
RENEW_MAX_S = 60.0  # the longest wait between renewals
FENCE_SHARE = 0.75  # of the timeout without a good renewal: the driver stops writing


def submission_id() -> Optional[str]:
    """The Ray job submission id when run by `ray job submit` (Ray's job supervisor
    hands the driver its job config, whose metadata holds it, in this variable)."""
    try:
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    except ValueError:
        return None
    return (config.get("metadata") or {}).get("job_submission_id")


def this_driver() -> Holder:
    pid = os.getpid()
    job_id = submission_id() or f"driver-{pid}"
    return Holder(job_id=job_id, host=socket.gethostname(), pid=pid,
                  since=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  renewed_at=time.time(), token=uuid.uuid4().hex)


class RunLease:
    """The driver's hold on a run: acquire() before writing, release() at the end."""

    def __init__(self, store, timeout_s: float):
        self.store, self.timeout_s = store, timeout_s
        self.backend = lease_backend(store)
        self.me = this_driver()
        self.version: Optional[str] = None
        self.lost: Optional[str] = None  # why the lease was lost, if it was
        self.takeover: Optional[str] = None  # the message when a stale lease was taken
        self.renewed = time.monotonic()      # the last good write of the lease
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.on_fence = _interrupt_main  # the session replaces it to say why it stopped

    def fenced(self) -> Optional[str]:
        """Why this driver must not dispatch or write any more (None while it may)."""
        if self.lost:
            return self.lost
        silent = time.monotonic() - self.renewed
        if self.version is not None and silent > self.timeout_s * FENCE_SHARE:
            return (f"the run's lease could not be renewed for {silent:.0f} s (more than 3/4 "
                    f"of job.lease_timeout_s={self.timeout_s:g} s): another job may take the "
                    f"run over, so this one stops writing")
        return None

    def acquire(self) -> "RunLease":
        if not self.backend.honours_conditions():
            raise UnsafeStore(
                f"the store of {self.store.uri} does not honour conditional writes (a second "
                f"If-None-Match create of one object succeeded): the run's lease could not "
                f"keep two jobs from writing one run. Use a store that does (AWS S3, MinIO, "
                f"recent Ceph), or a local job.output")
        for _ in range(3):  # a conflict means someone wrote in between: judge again
            current = self.backend.read()
            try:
                if current is None:
                    self.version = self.backend.create(asdict(self.me))
                else:
                    self.version = self._take_if_stale(Holder(**current[0]), current[1])
            except LeaseConflict:
                continue
            self.renewed = time.monotonic()
            self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                            name="run-lease")
            self._thread.start()
            return self
        raise LeaseHeld(f"run {self.store.uri}: another job took the lease at the same "
                        f"moment; see `python -m jobs.analysis.status {self.store.uri}`")

    def _take_if_stale(self, holder: Holder, version: str) -> str:
        age = self.backend.age_s  # the store's clock; the holder's only if it says nothing
        if age is None:
            age = time.time() - holder.renewed_at
        if _driver_gone(holder):  # no need to wait out the timeout: its pid is dead here
            new_version = self.backend.replace(asdict(self.me), version)
            self.takeover = (f"took over the lease of {holder.describe()}: its driver "
                             f"(pid {holder.pid} on this host) is gone")
            logger.warning("run %s: %s", self.store.uri, self.takeover)
            return new_version
        if age < self.timeout_s:
            raise LeaseHeld(
                f"run {self.store.uri} is held by {holder.describe()}, renewed {age:.0f} s "
                f"ago: one job per run. Wait for it to end, or stop it (`ray job stop "
                f"{holder.job_id}` or kill pid {holder.pid} on {holder.host}); if that "
                f"driver is gone its lease is taken over once it has not been renewed for "
                f"job.lease_timeout_s={self.timeout_s:g} s (in {self.timeout_s - age:.0f} s).")
        new_version = self.backend.replace(asdict(self.me), version)
        self.takeover = (f"took over the lease of {holder.describe()}: not renewed for "
                         f"{age:.0f} s > job.lease_timeout_s={self.timeout_s:g} s (that "
                         f"driver is gone)")
        logger.warning("run %s: %s", self.store.uri, self.takeover)
        return new_version

    def _renew_loop(self) -> None:
        every = min(self.timeout_s / 3, RENEW_MAX_S)
        wait = every
        while not self._stop.wait(wait):
            # After a failed renewal, try again within seconds: the fence closes at 3/4
            # of the timeout, and an outage must not cost the session.
            wait = min(every, RETRY_S)
            self.me.renewed_at = time.time()
            sent = time.monotonic()  # the store wrote it no earlier than this
            try:
                self.version = self.backend.replace(asdict(self.me), self.version)
                self.renewed = sent
                wait = every
            except LeaseConflict:
                current = self.backend.read()
                if current is not None and current[0].get("token") == self.me.token:
                    # Our own write: the SDK retried a renewal whose reply was lost, and
                    # the retry saw the version the first attempt had already written.
                    self.version, self.renewed = current[1], sent
                    wait = every
                    continue
                taker = Holder(**current[0]).describe() if current else "nobody"
                self.lost = f"the run's lease was taken over by {taker}"
                logger.error("run %s: %s; this driver must stop", self.store.uri, self.lost)
                self.on_fence(self.lost)  # stop this job: two jobs must not write one run
                return
            except Exception as exc:  # noqa: BLE001 - storage hiccup: try again soon
                logger.warning("lease renewal failed (will retry): %s", exc)
                reason = self.fenced()
                if reason:  # from this thread: the others may be stuck on the same store
                    logger.error("run %s: %s", self.store.uri, reason)
                    self.on_fence(reason)
                    return

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.version is not None and self.lost is None:
            self.backend.delete(self.version)


def _interrupt_main(reason: str) -> None:
    import _thread
    _thread.interrupt_main()  # the session's wait ends in KeyboardInterrupt; it cleans up


def _driver_gone(holder: Holder) -> bool:
    """True only when the holder ran on this host and its pid no longer exists."""
    if holder.host != socket.gethostname() or holder.pid == os.getpid():
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False
