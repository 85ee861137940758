"""The run's lease object, ``<run>/lease.json``: who holds the run (``Holder``) and the
conditional writes that keep two drivers from both holding it.

A back end reads the lease as (holder, version) and creates, replaces-if-version and
deletes it; a lost condition raises ``LeaseConflict``:
- S3: PutObject ``If-None-Match: *`` creates only if absent, ``If-Match: <etag>``
  replaces only the version that was read (S3 answers 412; AWS since 2024, moto 5.x).
  pyarrow's filesystem has no conditional put, hence boto3 for this one object.
- Local files: create with O_EXCL; compare-and-replace under an flock on a sidecar
  lock file (one host, or a shared filesystem with working locks).
Each back end also records the age of the lease it read last on the store's own clock
(``age_s``). The driver's policy (acquire, renew, fence, take over) is
jobs/runs/lease.py; readers such as jobs.analysis.status only need ``read_holder``.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from jobs.io.run_store import LEASE_FILE
from jobs.io.storage import Location, is_local, write_local_durably


class LeaseConflict(Exception):
    """A conditional write lost: the lease changed since it was read."""


# The lease's own S3 calls fail fast: a renewal stuck in the SDK's retries for minutes
# would keep a driver writing long after another job could have taken the run over.
LEASE_S3_TRIES, LEASE_CONNECT_S, LEASE_READ_S = 2, 5, 10


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
                raise LeaseConflict(code) from exc
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
            except LeaseConflict:
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
    try:
        sent = parsedate_to_datetime(date)
    except (TypeError, ValueError):  # a Date the store's answer garbled: it does not say
        return None
    # HTTP dates are GMT. One reads naive when it says "-0000", or when a proxy on the way
    # added its own Date and the two arrive joined ("..., 07:49:20 GMT, ... GMT"): the
    # first is read, as UTC. Naive against botocore's aware LastModified raised TypeError
    # in the lease's first read, and no resume could start behind such a proxy.
    sent, modified = (t if t.tzinfo else t.replace(tzinfo=datetime.timezone.utc)
                      for t in (sent, modified))
    return (sent - modified).total_seconds()


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
                raise LeaseConflict("exists") from None
            return self._write(body)

    def replace(self, body: dict, version: str) -> str:
        with self._locked():
            current = self._read()
            if current is None or current[1] != version:
                raise LeaseConflict("changed")
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


def lease_backend(store) -> Any:
    return conditional_object(store.loc(LEASE_FILE), store.storage)


def conditional_object(loc: Location, storage) -> Any:
    """The lease's conditional writes on any JSON object (read, create, replace-if-
    version, delete; LeaseConflict); the export lock (jobs/analysis/export_journal.py)
    is one. A local object's version is its body's token and renewed_at."""
    return _LocalLease(loc) if is_local(loc) else _S3Lease(loc, storage)


def read_holder(store) -> Optional[Holder]:
    """Who holds the run now (None when nobody does)."""
    current = lease_backend(store).read()
    return None if current is None else Holder(**current[0])
