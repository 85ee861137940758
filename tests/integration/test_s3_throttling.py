"""A throttling S3 does not end a run: the moto server behind a proxy answering a share
of requests as S3 does under load (503 SlowDown, 500 InternalError, S3's XML error
bodies; bench/s3_faults.py). Before jobs/io/s3_retry.py, a small ranged read
answered with such a body ended the session (`AWS Error INTERNAL_FAILURE ... Failed to
flush response stream`, not retried by the SDK nor by Ray Data). A whole run behind it,
with a 30 s outage, is test_operator_safety.py's."""

from __future__ import annotations

import pyarrow as pa
import pytest

from bench.s3_faults import ThrottlingS3Proxy
from jobs.config import StorageConfig
from jobs.io import s3_retry
from jobs.io.run_store import RunStore
from jobs.io.schema import REJECTS
from tests.integration.helpers import BUCKET

pytestmark = pytest.mark.integration


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_parts_and_small_objects_go_through_a_third_of_requests_throttled(s3_endpoint):
    """The read-back of small parts (a footer, one column chunk) and small JSON objects:
    the SDK's own retries do not cover an error body longer than the range read."""
    proxy = ThrottlingS3Proxy(_port(s3_endpoint), error_share=0.3, seed=7)
    try:
        store = RunStore(f"s3://{BUCKET}/throttled-{id(proxy)}",
                         StorageConfig(endpoint_url=proxy.endpoint))
        before = sum(s3_retry.local_counts().values())
        store.init_run_file()
        for i in range(8):
            store.write_part("rejects", a_reject(i), [f"r{i}"])
            assert store.read_json("run.json")["key_salt"]
        assert len(store.part_paths("rejects")) == 8
        assert store.read_kind("rejects").num_rows == 8
        assert proxy.total_throttled() > 10
        assert sum(s3_retry.local_counts().values()) > before  # ours, not only the SDK's
    finally:
        proxy.close()


def a_reject(i: int) -> pa.Table:
    return pa.Table.from_pylist([{"source": "p.jsonl", "line": i, "reason": "not JSON",
                                  "raw": "x" * 40, "reject_id": f"r{i}"}], schema=REJECTS)
