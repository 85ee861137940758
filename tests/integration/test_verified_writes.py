"""Verified writes against the real S3 server: the store checks each part's Content-MD5,
and a part counts only once it reads back whole (a damaged upload is rewritten)."""

from __future__ import annotations

import hashlib
import uuid

import pyarrow as pa
import pytest

import jobs.io.run_store as run_store_module
from jobs.config import StorageConfig
from jobs.io.run_store import DamagedPart, RunStore
from jobs.io.storage import s3_client, put_verified
from tests.integration.helpers import BUCKET
from tests.support.run_rows import make_row

pytestmark = pytest.mark.integration


def _store(s3_endpoint: str) -> RunStore:
    return RunStore(f"s3://{BUCKET}/verified/{uuid.uuid4().hex[:8]}",
                    StorageConfig(endpoint_url=s3_endpoint))


def _rows(n: int) -> pa.Table:
    from jobs.io.schema import DATA
    return pa.Table.from_pylist([make_row(f"k{i}") for i in range(n)], schema=DATA)


def test_parts_are_stored_as_plain_bodies_with_our_md5(s3_endpoint):
    """The stored object is exactly our bytes (no aws-chunked framing): its ETag, the
    MD5 of what the store kept, is the Content-MD5 we sent. (moto accepts a wrong
    Content-MD5 without checking it; AWS, MinIO and Ceph refuse it: BadDigest.)"""
    storage = StorageConfig(endpoint_url=s3_endpoint)
    store = _store(s3_endpoint)
    data = b"PAR1" + bytes(range(256)) * 400 + b"PAR1"
    put_verified(store.loc("ok.bin"), data, storage)
    head = s3_client(storage).head_object(Bucket=BUCKET, Key=store.loc("ok.bin").path
                                         .split("/", 1)[1])
    assert head["ETag"].strip('"') == hashlib.md5(data).hexdigest()
    assert store.root.fs.open_input_stream(store.loc("ok.bin").path).read() == data


def _damaging_put(damaged_writes: int):
    """put_verified whose first writes store a truncated body, as an interrupted or
    mis-framed upload would."""
    calls = {"n": 0}

    def put(loc, data, storage):
        calls["n"] += 1
        body = data[: len(data) // 3] if calls["n"] <= damaged_writes else data
        put_verified(loc, body, storage)
    return put, calls


def test_a_damaged_upload_is_detected_and_rewritten(s3_endpoint, monkeypatch):
    store = _store(s3_endpoint)
    put, calls = _damaging_put(damaged_writes=1)
    monkeypatch.setattr(run_store_module, "put_verified", put)
    table = _rows(50)
    name = store.write_part("data", table, [f"k{i}" for i in range(50)])
    assert calls["n"] == 2  # written, read back damaged, rewritten
    assert store.read_part(store.loc("data", name).path).num_rows == 50
    assert store.quarantined() == []


def test_a_part_that_stays_damaged_fails_the_write_and_is_not_counted(s3_endpoint, monkeypatch):
    store = _store(s3_endpoint)
    put, calls = _damaging_put(damaged_writes=99)
    monkeypatch.setattr(run_store_module, "put_verified", put)
    with pytest.raises(DamagedPart, match="still damaged after 3 writes"):
        store.write_part("data", _rows(20), [f"k{i}" for i in range(20)])
    assert calls["n"] == 3
    # A reader sees no rows from it (and moves the damaged object aside).
    assert store.read_kind("data", ["key"]).num_rows == 0
    assert len(store.quarantined()) == 1
