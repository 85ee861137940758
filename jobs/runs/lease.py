"""One job per run: ``<run>/lease.json`` names the driver that holds the run.

Four drivers on one run generated 3.7x the GPU work and wrote duplicated (key,
version) rows while each printed "succeeded". So a driver takes the run's lease before
it writes anything, renews it every ``lease_timeout_s / 3`` from a thread, and deletes
it when it ends. A second driver finds a fresh lease and refuses, naming the holder
(Ray job submission id if any, host, pid, since). A lease not renewed for
``job.lease_timeout_s`` (the holder was SIGKILLed, its node lost) is taken over, and
the takeover is said.

Every write is conditional, so two drivers cannot both win:
- S3: PutObject ``If-None-Match: *`` creates only if absent, ``If-Match: <etag>``
  replaces only the version that was read (S3 answers 412; AWS since 2024, moto 5.x).
  pyarrow's filesystem has no conditional put, hence boto3 for this one object.
- Local files: create with O_EXCL; compare-and-replace under an flock on a sidecar
  lock file (one host, or a shared filesystem with working locks).

Staleness is judged by the store's clock, not the holder's: the age of a lease is the
store's time now (S3: the response's Date; locally: the mtime of a file just touched
beside it) minus the lease object's last modification (LastModified / mtime), so a
holder whose clock is off can neither block the run nor lose it early. A holder on this
very host whose pid is dead (a SIGKILLed driver resubmitted where it ran) is taken over
at once; a reused pid only makes us wait for the timeout.

The lease fences its holder: ``fenced()`` is true once the last good renewal is older
than half the timeout (a renewal that cannot reach the store fails within seconds: the
lease's own S3 client has short timeouts and two tries) or once the lease is lost; the
session then stops dispatching, and a driver that lost its lease writes nothing more
(no progress.json, report or release over the next holder's). A renewal answered 412
is first read back: when the lease still carries our token (our own write, retried by
the SDK after its reply was lost), it is ours and the session goes on. Once per run the
store is checked to honour conditional writes (a second If-None-Match create must fail):
a store that ignores them could let two jobs write one run, and is refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Optional

from jobs.io.storage import Location, is_local, write_local_durably

logger = logging.getLogger("raygen")
LEASE_FILE = "lease.json"


class LeaseHeld(RuntimeError):
    """Another live job holds the run."""


class _Conflict(Exception):
    """A conditional write lost: the lease changed since it was read."""


class UnsafeStore(RuntimeError):
    """The store does not honour conditional writes: the lease could not fence."""


# The lease's own S3 calls fail fast: a renewal stuck in the SDK's retries for minutes
# would keep a driver writing long after another job could have taken the run over.
LEASE_S3_TRIES, LEASE_CONNECT_S, LEASE_READ_S = 2, 5, 10
RETRY_S = 5.0  # the wait before the next try after a renewal failed


@dataclass
class Holder:
    job_id: str           # Ray job submission id, else "driver-<pid>"
    host: str
    pid: int
    since: str            # ISO time the lease was taken
    renewed_at: float     # epoch seconds of the last renewal
    token: str            # unique per driver session: tells our lease from a taker's

    def describe(self) -> str:
        return f"job {self.job_id} on {self.host} (pid {self.pid}) since {self.since}"


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


# ---- storage back ends: read -> (holder, version); create; replace-if-version; delete ----

class _S3Lease:
    def __init__(self, loc: Location, storage):
        import boto3
        from botocore.config import Config
        self.bucket, _, self.key = loc.path.partition("/")
        self.client = boto3.client(
            "s3", endpoint_url=storage.endpoint_url, region_name=storage.region,
            config=Config(request_checksum_calculation="when_required",
                          response_checksum_validation="when_required",
                          connect_timeout=LEASE_CONNECT_S, read_timeout=LEASE_READ_S,
                          retries={"mode": "standard", "max_attempts": LEASE_S3_TRIES}))
        self.age_s: Optional[float] = None  # of the lease read last, on the store's clock

    def read(self) -> Optional[tuple[dict, str]]:
        for attempt in range(5):
            try:
                obj = self.client.get_object(Bucket=self.bucket, Key=self.key)
            except self.client.exceptions.NoSuchKey:
                return None
            try:
                body = json.loads(obj["Body"].read())
            except ValueError:  # S3 serves whole objects; moto was seen serving one torn
                if attempt == 4:  # while it was being replaced: read again
                    raise
                time.sleep(0.1)
                continue
            self.age_s = _store_age(obj)
            return body, obj["ETag"]
        return None

    def _put(self, body: dict, key: Optional[str] = None, **condition: str) -> str:
        from botocore.exceptions import ClientError
        try:
            return self.client.put_object(Bucket=self.bucket, Key=key or self.key,
                                          Body=json.dumps(body).encode(), **condition)["ETag"]
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412) or code in ("PreconditionFailed", "NoSuchKey",
                                                "ConditionalRequestConflict"):
                raise _Conflict(code) from exc
            raise

    def create(self, body: dict) -> str:
        return self._put(body, IfNoneMatch="*")

    def replace(self, body: dict, version: str) -> str:
        return self._put(body, IfMatch=version)

    def delete(self, version: str) -> None:
        with contextlib.suppress(Exception):  # gone or taken over: nothing of ours to delete
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=version)

    def honours_conditions(self) -> bool:
        """Does a second If-None-Match create of one object fail, as it must?"""
        probe = f"{self.key}.probe-{uuid.uuid4().hex}"
        try:
            self._put({"probe": True}, probe, IfNoneMatch="*")
            try:
                self._put({"probe": True}, probe, IfNoneMatch="*")
                return False
            except _Conflict:
                return True
        finally:
            with contextlib.suppress(Exception):
                self.client.delete_object(Bucket=self.bucket, Key=probe)


def _store_age(obj: dict) -> Optional[float]:
    """Seconds since the object was last written, by the store's own clock (its Date
    header against LastModified); None when the store does not say."""
    from email.utils import parsedate_to_datetime
    date = obj.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    modified = obj.get("LastModified")
    if not date or modified is None:
        return None
    return (parsedate_to_datetime(date) - modified).total_seconds()


class _LocalLease:
    def __init__(self, loc: Location):
        self.path = loc.path
        self.lock_path = os.path.join(os.path.dirname(loc.path), f".{LEASE_FILE}.lock")
        self.age_s: Optional[float] = None

    @contextlib.contextmanager
    def _locked(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> Optional[tuple[dict, str]]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
                modified = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None
        holder = json.loads(data)
        # The filesystem's clock (an NFS server's): touch the lock file, read its mtime.
        with open(self.lock_path, "a"):
            os.utime(self.lock_path)
        self.age_s = os.stat(self.lock_path).st_mtime - modified
        return holder, _version(holder)

    def read(self) -> Optional[tuple[dict, str]]:
        return self._read()

    def _write(self, body: dict) -> str:
        # readers see the old or the new lease, after a crash too
        write_local_durably(self.path, json.dumps(body).encode())
        return _version(body)

    def create(self, body: dict) -> str:
        with self._locked():
            try:
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                raise _Conflict("exists") from None
            return self._write(body)

    def replace(self, body: dict, version: str) -> str:
        with self._locked():
            current = self._read()
            if current is None or current[1] != version:
                raise _Conflict("changed")
            return self._write(body)

    def delete(self, version: str) -> None:
        with self._locked():
            current = self._read()
            if current is not None and current[1] == version:
                os.unlink(self.path)

    def honours_conditions(self) -> bool:
        return True  # O_EXCL under an flock: a local filesystem's own guarantee


def _version(holder: dict) -> str:
    """A local lease's version: its writer and renewal time (each write changes it)."""
    return f"{holder.get('token')}@{holder.get('renewed_at')!r}"


def _backend(store) -> Any:
    loc = store.loc(LEASE_FILE)
    return _LocalLease(loc) if is_local(loc) else _S3Lease(loc, store.storage)


def read_holder(store) -> Optional[Holder]:
    """Who holds the run now (None when nobody does); for jobs.analysis.status."""
    current = _backend(store).read()
    return None if current is None else Holder(**current[0])


class RunLease:
    """The driver's hold on a run: acquire() before writing, release() at the end."""

    def __init__(self, store, timeout_s: float):
        self.store, self.timeout_s = store, timeout_s
        self.backend = _backend(store)
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
        if self.version is not None and silent > self.timeout_s / 2:
            return (f"the run's lease could not be renewed for {silent:.0f} s (more than half "
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
            except _Conflict:
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
        wait = self.timeout_s / 3
        while not self._stop.wait(wait):
            # After a failed renewal, try again within seconds: the fence closes at half
            # the timeout, and one hiccup must not cost the session.
            wait = min(self.timeout_s / 3, RETRY_S)
            self.me.renewed_at = time.time()
            try:
                self.version = self.backend.replace(asdict(self.me), self.version)
                self.renewed = time.monotonic()
                wait = self.timeout_s / 3
            except _Conflict:
                current = self.backend.read()
                if current is not None and current[0].get("token") == self.me.token:
                    # Our own write: the SDK retried a renewal whose reply was lost, and
                    # the retry saw the version the first attempt had already written.
                    self.version, self.renewed = current[1], time.monotonic()
                    wait = self.timeout_s / 3
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
