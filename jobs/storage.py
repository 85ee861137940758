"""Local paths and s3:// URIs behind one pyarrow filesystem API.

Writes are atomic so a kill at any moment leaves no unreadable file: on S3 an object
appears whole when its upload completes (an interrupted multipart upload stays
invisible); locally we write a hidden temp file and rename it. Credentials come from
the AWS environment/credential chain only and are never logged.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import urlparse

import pyarrow.fs as pafs

from jobs.config import StorageConfig


@dataclass(frozen=True)
class Location:
    fs: pafs.FileSystem
    path: str          # filesystem path (bucket/key for S3, absolute path locally)
    uri: str           # what the user wrote, for messages

    def join(self, *parts: str) -> "Location":
        return Location(self.fs, posixpath.join(self.path, *parts),
                        posixpath.join(self.uri, *parts))


def _s3(storage: StorageConfig) -> pafs.S3FileSystem:
    # The SDK's "default" strategy (delay 25 ms * 2^attempt, no retry quota) rather than
    # "standard": standard's shared retry quota (~50 connection-error retries per client)
    # runs dry within seconds of an outage when many parts are in flight, and then every
    # request fails at once. Doubling delays ride out an outage of about
    # 25 ms * 2^max_attempts in total, per request.
    kwargs: dict[str, Any] = {
        "region": storage.region,
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
    import os
    return Location(pafs.LocalFileSystem(), os.path.abspath(uri), uri)


def is_local(loc: Location) -> bool:
    return isinstance(loc.fs, pafs.LocalFileSystem)


def write_bytes_atomic(loc: Location, data: bytes) -> None:
    if is_local(loc):
        parent, name = posixpath.split(loc.path)
        loc.fs.create_dir(parent, recursive=True)
        tmp = posixpath.join(parent, f".{name}.tmp-{uuid.uuid4().hex}")
        with loc.fs.open_output_stream(tmp) as out:
            out.write(data)
        loc.fs.move(tmp, loc.path)  # rename(2): atomic on one filesystem
        return
    with loc.fs.open_output_stream(loc.path) as out:
        out.write(data)


def read_bytes(loc: Location) -> Optional[bytes]:
    try:
        with loc.fs.open_input_stream(loc.path) as inp:
            return inp.read()
    except FileNotFoundError:
        return None


def write_json_atomic(loc: Location, obj: Any) -> None:
    write_bytes_atomic(loc, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
                       .encode())


def read_json(loc: Location) -> Optional[Any]:
    data = read_bytes(loc)
    return None if data is None else json.loads(data)


def list_files(loc: Location, suffix: str = "") -> list[pafs.FileInfo]:
    """Files directly in a folder, sorted by path; [] when it does not exist yet."""
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
    except FileNotFoundError:
        return []
    files = [i for i in infos if i.type == pafs.FileType.File
             and not posixpath.basename(i.path).startswith(".") and i.path.endswith(suffix)]
    return sorted(files, key=lambda i: i.path)
