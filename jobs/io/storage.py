"""Local paths and s3:// URIs behind one pyarrow filesystem API.

Writes are atomic so a kill at any moment leaves no unreadable file: on S3 an object
appears whole when its upload completes (an interrupted multipart upload stays
invisible); locally we write a hidden temp file and rename it. Credentials come from
the AWS environment/credential chain only and are never logged.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Optional
from urllib.parse import urlparse

import pyarrow.fs as pafs

from jobs.config import StorageConfig
from jobs.io import s3_retry
from jobs.io.s3_retry import RetryingInputFile, retried


@dataclass(frozen=True)
class Location:
    fs: pafs.FileSystem
    path: str          # filesystem path (bucket/key for S3, absolute path locally)
    uri: str           # what the user wrote, for messages

    def join(self, *parts: str) -> "Location":
        return Location(self.fs, posixpath.join(self.path, *parts),
                        posixpath.join(self.uri, *parts))


# Plain request bodies for S3-compatible stores. The AWS SDKs' default
# ("when_supported") sends every upload aws-chunked with a trailing CRC; a store that
# does not decode that framing (the moto server here, older MinIO/Ceph) stores the
# framing itself as the object: an unreadable part. pyarrow's AWS C++ SDK and botocore
# both read these variables; checksums we send ourselves (Content-MD5, below).
PLAIN_BODY_ENV = {"AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
                  "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}


def use_plain_bodies() -> None:
    for key, value in PLAIN_BODY_ENV.items():
        os.environ.setdefault(key, value)


def _s3(storage: StorageConfig) -> pafs.S3FileSystem:
    # The SDK's "default" strategy (delay 25 ms * 2^attempt, no retry quota) rather than
    # "standard": standard's shared retry quota (~50 connection-error retries per client)
    # runs dry within seconds of an outage when many parts are in flight, and then every
    # request fails at once. Doubling delays ride out an outage of about
    # 25 ms * 2^max_attempts in total, per request.
    use_plain_bodies()  # before the SDK client reads its configuration
    s3_retry.configure(storage.s3_retry_window_s)
    # allow_delayed_open: an object smaller than one upload part (all but data parts
    # over 10 MB) goes up in one PutObject when it is closed, not as three requests
    # (create, part, complete a multipart upload). Its errors are raised at close.
    kwargs: dict[str, Any] = {
        "region": storage.region, "allow_delayed_open": True,
        "retry_strategy": pafs.AwsDefaultS3RetryStrategy(storage.s3_retry_max_attempts)}
    if storage.endpoint_url:
        parsed = urlparse(storage.endpoint_url)
        kwargs.update(endpoint_override=parsed.netloc or parsed.path,
                      scheme=parsed.scheme or "https")
    return pafs.S3FileSystem(**kwargs)


def locate(uri: str, storage: StorageConfig) -> Location:
    if uri.startswith("s3://"):
        return Location(_s3(storage), uri[len("s3://"):].rstrip("/"), uri.rstrip("/"))
    if "://" in uri:
        raise ValueError(f"unsupported URI scheme in {uri!r}: use a local path or s3://")
    return Location(pafs.LocalFileSystem(), os.path.abspath(uri), uri)


def is_local(loc: Location) -> bool:
    return isinstance(loc.fs, pafs.LocalFileSystem)


def write_bytes_atomic(loc: Location, data: bytes) -> None:
    if is_local(loc):
        write_local_durably(loc.path, data)
        return
    retried(_put_stream, loc, data, what=f"write of {loc.uri}")


def _put_stream(loc: Location, data: bytes) -> None:
    with loc.fs.open_output_stream(loc.path) as out:
        out.write(data)


def write_local_durably(path: str, data: bytes) -> None:
    """A hidden temp file, fsynced, renamed over ``path``, then the directory fsynced:
    after a crash or power loss the file is the old one or the whole new one, never a
    right-sized file of zeros (ext4/XFS delayed allocation without fsync). On any error,
    a full disk included, the temp file is removed and the OSError is raised as it is."""
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # rename(2): atomic on one filesystem
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            raise StorageFull(f"[Errno {exc.errno}] {exc.strerror}: '{path}'") from exc
        if isinstance(exc, OSError) and exc.filename is None:  # os.write names no file
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise
    _fsync_dir(parent)


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class StorageFull(OSError):
    """A write found no space (or quota) left. One message argument, naming the file:
    Ray Data appends its retry advice to a task error's args and Ray pickles it to the
    driver, which turns a plain OSError's filename into that advice."""

    def __init__(self, message: str):
        super().__init__(message)


def exception_chain(exc: Optional[BaseException]) -> Iterator[BaseException]:
    """``exc`` and what caused it, outermost first, each once: ``__cause__`` or
    ``__context__``, and through Ray's task errors, which carry the worker's exception as
    ``.cause`` (a RayTaskError(X) is an X saying Ray's text: the X is yielded instead)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            exc = cause
            continue
        yield exc
        exc = exc.__cause__ or exc.__context__


def storage_full(exc: Optional[BaseException]) -> Optional[str]:
    """What filled up, if a full disk or quota is behind ``exc``, else None."""
    plain = None
    for link in exception_chain(exc):
        if isinstance(link, StorageFull):
            return str(link).split("\n")[0]
        if isinstance(link, OSError) and link.errno in FULL_ERRNOS and plain is None:
            plain = f"[Errno {link.errno}] {link.strerror}"
    return plain


def _fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable. Some filesystems (e.g. some FUSE/NFS mounts)
    refuse fsync on a directory: the rename itself is then all they offer."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def put_verified(loc: Location, data: bytes, storage: StorageConfig) -> None:
    """Write one object as a plain body with its Content-MD5, which S3, MinIO and Ceph
    check (BadDigest on a mismatch; the moto test server does not check it, hence the
    read-back in RunStore.write_part). Local paths: the atomic rename."""
    if is_local(loc):
        write_bytes_atomic(loc, data)
        return
    bucket, _, key = loc.path.partition("/")
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    # botocore's own tries draw on a retry quota that an outage empties in seconds;
    # ``retried`` goes on for storage.s3_retry_window_s.
    retried(s3_client(storage).put_object, Bucket=bucket, Key=key, Body=data, ContentMD5=md5,
            what=f"upload of {loc.uri}")


_BOTO_CLIENTS: dict[tuple, Any] = {}


def s3_client(storage: StorageConfig) -> Any:
    """boto3 for what pyarrow's filesystem cannot do (Content-MD5, conditional puts):
    plain bodies, and as many tries as pyarrow's client gets (botocore's standard mode
    caps each delay at 20 s; its retry quota can run dry in an outage, hence the loop
    in put_verified)."""
    s3_retry.configure(storage.s3_retry_window_s)
    key = (storage.endpoint_url, storage.region, os.getpid())
    if key not in _BOTO_CLIENTS:
        import boto3
        from botocore.config import Config
        _BOTO_CLIENTS[key] = boto3.client(
            "s3", endpoint_url=storage.endpoint_url, region_name=storage.region,
            config=Config(request_checksum_calculation="when_required",
                          response_checksum_validation="when_required",
                          retries={"mode": "standard",
                                   "max_attempts": storage.s3_retry_max_attempts}))
    return _BOTO_CLIENTS[key]


class AlreadyExists(Exception):
    """create_exclusive found the object there already."""


def create_exclusive(loc: Location, data: bytes, storage: StorageConfig) -> None:
    """Write an object only if none is there (raises AlreadyExists): S3 PutObject with
    If-None-Match: * (412 when it exists; AWS since 2024, moto 5.x); locally a fsynced
    temp file hard-linked to the name (link(2) fails on an existing name, and a reader
    never sees a half-written file, which an O_EXCL create then write would show)."""
    if not is_local(loc):
        from botocore.exceptions import ClientError
        bucket, _, key = loc.path.partition("/")
        try:
            s3_client(storage).put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412):
                raise AlreadyExists(loc.uri) from None
            raise
        return
    parent, name = os.path.split(loc.path)
    tmp = os.path.join(parent, f".{name}.new-{uuid.uuid4().hex}")
    write_local_durably(tmp, data)
    try:
        os.link(tmp, loc.path)
    except FileExistsError:
        raise AlreadyExists(loc.uri) from None
    finally:
        os.unlink(tmp)
    _fsync_dir(parent)


def read_bytes(loc: Location) -> Optional[bytes]:
    try:
        return retried(read_whole, loc.fs, loc.path, what=f"read of {loc.uri}")
    except FileNotFoundError:
        return None


def read_whole(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as inp:
        return inp.read()


def open_retrying(loc: Location) -> RetryingInputFile:
    """``loc`` opened for reading, every read retried on transient S3 errors."""
    return RetryingInputFile(loc.fs, loc.path)


def file_info(loc: Location) -> pafs.FileInfo:
    return retried(loc.fs.get_file_info, loc.path, what=f"stat of {loc.uri}")


def delete_file(fs: pafs.FileSystem, path: str) -> None:
    retried(fs.delete_file, path, what=f"delete of {path}")


def write_json_atomic(loc: Location, obj: Any) -> None:
    write_bytes_atomic(loc, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
                       .encode())


def read_json(loc: Location) -> Optional[Any]:
    """The object as JSON; None when absent. Read again when it does not parse: S3 serves
    whole objects, but the local test server (moto) was seen serving one torn while it
    was being replaced."""
    for attempt in range(3):
        data = read_bytes(loc)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            if attempt == 2:
                raise
            time.sleep(0.1)


def list_files(loc: Location, suffix: str = "", recursive: bool = False) -> list[pafs.FileInfo]:
    """Files directly in a folder (or, recursive, anywhere below it: one S3 listing for
    all its subfolders), sorted by path; [] when it does not exist yet."""
    try:
        infos = retried(loc.fs.get_file_info, pafs.FileSelector(
            loc.path, allow_not_found=True, recursive=recursive), what=f"listing of {loc.uri}")
    except FileNotFoundError:
        return []
    files = [i for i in infos if i.type == pafs.FileType.File
             and not posixpath.basename(i.path).startswith(".") and i.path.endswith(suffix)]
    return sorted(files, key=lambda i: i.path)
