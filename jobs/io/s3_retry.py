"""Transient S3 errors, retried where raygen touches the store, and counted.

S3 throttles a prefix under load (503 SlowDown) and answers 500 now and then by design:
clients are told to retry. pyarrow's S3 client (the AWS C++ SDK) retries both itself,
except in one case: an error response whose body (S3's XML, a few hundred bytes) is
longer than the range a read asked for (a Parquet column chunk, a small JSON object)
overflows that read's buffer, and the SDK reports a non-retryable `AWS Error
INTERNAL_FAILURE ... Failed to flush response stream` with the status lost. Measured
behind a proxy throttling 10% of requests (tests/support/s3_throttle.py): 16 of 80
read-backs of a small part failed that way, none of the 503s to whole reads did. Any
SDK also gives up after its own tries. So every store call raygen makes goes through
``retried`` (or reads through ``RetryingInputFile``): doubling delays on what S3 can
answer transiently, for as long as ``storage.s3_retry_window_s`` (a store outage of a
few minutes is ridden out), and a count of the tries (progress.json's
``s3_retries`` and the job's gauge).

The count crosses processes through Ray's internal key-value store (GCS): each
process that retried puts its own running totals under the job's prefix, only when
it retries; the driver sums them (``job_retries``).
"""

from __future__ import annotations

import collections
import io
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Optional, TypeVar

logger = logging.getLogger("raygen")

T = TypeVar("T")

WINDOW_S = 300.0          # storage.s3_retry_window_s: how long transient errors may last
FIRST_DELAY_S = 0.1       # doubling: 0.1, 0.2, ... 6.4, then every 10 s
MAX_DELAY_S = 10.0


def configure(window_s: float) -> None:
    """This process's retry window (set wherever a store client is made from the config)."""
    global WINDOW_S
    WINDOW_S = window_s


# The AWS C++ SDK's error names for what may pass (its message is "AWS Error <NAME>
# during <Operation> operation: ..."; an unmapped status reads "UNKNOWN (HTTP status N)").
SDK_TRANSIENT = ("INTERNAL_FAILURE", "SLOW_DOWN", "SERVICE_UNAVAILABLE", "THROTTLING",
                 "NETWORK_CONNECTION", "REQUEST_TIMEOUT", "REQUEST_TIME_TOO_SKEWED",
                 "HTTP status 500", "HTTP status 502", "HTTP status 503",
                 "HTTP status 504", "HTTP status 429")

_counts: collections.Counter = collections.Counter()
_lock = threading.Lock()
KV_PREFIX = "raygen/s3_retries/"


def kind_of(exc: BaseException) -> Optional[str]:
    """A short name of a transient store error (the thing to retry), else None."""
    if isinstance(exc, FileNotFoundError):
        return None
    text = str(exc)
    if isinstance(exc, OSError) and "AWS Error" in text:
        if "Failed to flush response stream" in text:
            return "sdk_flush"  # an error body longer than a small ranged read
        for name in SDK_TRANSIENT:
            if name in text:
                return name.lower().replace("http status ", "http_")
        return None
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError
    if isinstance(exc, (ConnectionError, HTTPClientError)):
        return "connection"
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        if status >= 500 or status == 429:
            return f"http_{status}"
    return None


def delay_s(attempt: int) -> float:
    return min(FIRST_DELAY_S * 2 ** attempt, MAX_DELAY_S)


def retried(call: Callable[..., T], *args: Any, what: str = "",
            window_s: Optional[float] = None, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, tried again after a transient store error, with
    doubling delays, for as long as such errors last up to ``window_s`` (default:
    ``storage.s3_retry_window_s``); any other error, or one past the window, is raised."""
    window = WINDOW_S if window_s is None else window_s
    first, attempt = None, 0
    while True:
        try:
            return call(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only transient errors are retried
            kind = kind_of(exc)
            now = time.monotonic()
            first = now if first is None else first
            wait = delay_s(attempt)
            if kind is None or now + wait - first > window:
                raise
            note(kind)
            logger.info("S3 %s: %s (try %d; again in %.1f s)", what or "request", kind,
                        attempt + 1, wait)
            time.sleep(wait)
            attempt += 1


def note(kind: str) -> None:
    """Count one retry of ``kind`` here, and publish this process's totals to Ray."""
    with _lock:
        _counts[kind] += 1
        counts = dict(_counts)
    _publish(counts)


def local_counts() -> dict[str, int]:
    with _lock:
        return dict(_counts)


def _kv():
    try:
        from ray.experimental import internal_kv
        import ray
        if not ray.is_initialized() or not internal_kv._internal_kv_initialized():
            return None, None
        return internal_kv, ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - no Ray here (a CLI tool, a unit test): local only
        return None, None


def _publish(counts: dict[str, int]) -> None:
    kv, job = _kv()
    if kv is None:
        return
    try:
        kv._internal_kv_put(f"{KV_PREFIX}{job}/{os.getpid()}", json.dumps(counts),
                            overwrite=True)
    except Exception as exc:  # noqa: BLE001 - a count is never worth a failed request
        logger.debug("S3 retry count not published: %s", exc)


def job_retries() -> dict[str, int]:
    """Retries of this Ray job's processes (this one's alone without Ray), by kind."""
    kv, job = _kv()
    if kv is None:
        return local_counts()
    total: collections.Counter = collections.Counter(local_counts())
    mine = f"{KV_PREFIX}{job}/{os.getpid()}"
    try:
        for key in kv._internal_kv_list(f"{KV_PREFIX}{job}/"):
            key = key.decode() if isinstance(key, bytes) else key
            if key != mine:
                total.update(json.loads(kv._internal_kv_get(key) or b"{}"))
    except Exception as exc:  # noqa: BLE001 - the count is a report, not the run
        logger.debug("S3 retry counts not read: %s", exc)
    return dict(total)


class RetryingInputFile(io.RawIOBase):
    """A seekable file over one S3 object (or local file) whose every read is
    ``retried``, reopened after an error: what Parquet and Arrow IPC readers are given,
    so a throttled small read (the footer, a column chunk) is tried again instead of
    ending the read."""

    def __init__(self, fs, path: str):
        super().__init__()
        self.fs, self.path = fs, path
        self._file = retried(fs.open_input_file, path, what=f"open {path}")
        self._size = self._file.size()
        self._pos, self._stale = 0, False

    def _pread(self, nbytes: int, offset: int) -> bytes:
        def once() -> bytes:
            if self._stale:  # the SDK's stream may be unusable after an error: a new one
                self._file = self.fs.open_input_file(self.path)
                self._stale = False
            try:
                return self._file.read_at(nbytes, offset)
            except Exception:
                self._stale = True
                raise
        return retried(once, what=f"read of {self.path}")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), max(0, self._size - self._pos))
        if n == 0:
            return 0
        data = self._pread(n, self._pos)
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        n = self._size - self._pos if size is None or size < 0 else min(size, self._size - self._pos)
        if n <= 0:
            return b""
        data = self._pread(n, self._pos)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if not self.closed:
            try:
                self._file.close()
            finally:
                super().close()
