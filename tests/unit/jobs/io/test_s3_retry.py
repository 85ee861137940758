"""Which store errors are tried again, for how long, and the reads that retry
(jobs/io/s3_retry.py). The real throttled store is tests/integration/test_s3_throttling.py."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

from jobs.io import s3_retry
from jobs.io.s3_retry import RetryingInputFile, kind_of, retried

# Messages as pyarrow's S3 client (the AWS C++ SDK) words them.
FLUSH = ("AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response "
         "stream (eof: 0, bad: 1)")
SLOW = "AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate."
REFUSED = ("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, "
           "Couldn't connect to server")
DENIED = "AWS Error ACCESS_DENIED during GetObject operation: Access Denied"
UNKNOWN_503 = "AWS Error UNKNOWN (HTTP status 503) during ListObjectsV2 operation: "


def client_error(status: int) -> ClientError:
    return ClientError({"Error": {"Code": str(status)},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(s3_retry, "FIRST_DELAY_S", 0.001)
    monkeypatch.setattr(s3_retry, "MAX_DELAY_S", 0.004)
    monkeypatch.setattr(s3_retry, "_counts", s3_retry.collections.Counter())


def test_what_s3_answers_transiently_is_retried_and_nothing_else():
    assert kind_of(OSError(FLUSH)) == "sdk_flush"
    assert kind_of(OSError(SLOW)) == "slow_down"
    assert kind_of(OSError(REFUSED)) == "network_connection"
    assert kind_of(OSError(UNKNOWN_503)) == "http_503"
    assert kind_of(EndpointConnectionError(endpoint_url="http://127.0.0.1:1")) == "connection"
    assert kind_of(ConnectionClosedError(endpoint_url="http://127.0.0.1:1")) == "connection"
    assert kind_of(client_error(503)) == "http_503" and kind_of(client_error(429)) == "http_429"
    assert kind_of(client_error(500)) == "http_500"
    # Wrong credentials, a bad request, a missing object, a local error: said at once.
    assert kind_of(OSError(DENIED)) is None and kind_of(client_error(403)) is None
    assert kind_of(client_error(400)) is None
    assert kind_of(FileNotFoundError("AWS Error NETWORK_CONNECTION")) is None
    assert kind_of(OSError(28, "No space left on device")) is None
    assert kind_of(ValueError(SLOW)) is None


def test_a_transient_error_is_tried_again_and_counted():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError(FLUSH)
        return "ok"
    assert retried(flaky) == "ok" and len(calls) == 3
    assert s3_retry.local_counts() == {"sdk_flush": 2}
    assert s3_retry.job_retries() == {"sdk_flush": 2}  # no Ray here: this process's own


def test_any_other_error_is_raised_at_once():
    calls = []

    def denied():
        calls.append(1)
        raise OSError(DENIED)
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        retried(denied)
    assert len(calls) == 1 and s3_retry.local_counts() == {}


def test_transient_errors_lasting_past_the_window_are_raised():
    calls = []

    def down():
        calls.append(1)
        raise OSError(REFUSED)
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):
        retried(down, window_s=0.05)
    assert 3 <= len(calls) < 100  # doubling delays up to 4 ms here, for 50 ms


class FlakyFile:
    """An S3 object's file: ``fail`` reads raise the SDK's flush error, and a file
    that failed stays broken (its stream is bad), as the SDK's does."""

    def __init__(self, data: bytes, owner: "FlakyFS"):
        self.data, self.owner, self.bad = data, owner, False

    def size(self):
        return len(self.data)

    def read_at(self, n, offset):
        if self.bad:
            raise OSError("AWS Error INTERNAL_FAILURE: stream is bad")
        if self.owner.fail > 0:
            self.owner.fail -= 1
            self.bad = True
            raise OSError(FLUSH)
        return self.data[offset:offset + n]

    def close(self):
        pass


class FlakyFS:
    def __init__(self, data: bytes, fail: int):
        self.data, self.fail, self.opened = data, fail, 0

    def open_input_file(self, path):
        self.opened += 1
        return FlakyFile(self.data, self)


def test_a_parquet_read_through_a_failing_small_read_is_whole():
    table = pa.table({"key": [f"k{i}" for i in range(50)], "text": ["x" * 100] * 50})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    fs = FlakyFS(buf.getvalue(), fail=3)
    with RetryingInputFile(fs, "bucket/part.parquet") as f:
        got = pq.ParquetFile(f).read(columns=["key"])
    assert got.column("key").to_pylist() == table.column("key").to_pylist()
    assert fs.opened == 4  # reopened after each failed read: the SDK's stream was bad
    assert s3_retry.local_counts() == {"sdk_flush": 3}


def test_seek_tell_and_reads_past_the_end():
    fs = FlakyFS(b"0123456789", fail=0)
    f = RetryingInputFile(fs, "p")
    assert f.read(3) == b"012" and f.tell() == 3
    f.seek(-2, io.SEEK_END)
    assert f.read() == b"89" and f.read(5) == b""
    f.seek(1)
    buffer = bytearray(4)
    assert f.readinto(buffer) == 4 and bytes(buffer) == b"1234"
