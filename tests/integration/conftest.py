"""Shared real parts for integration tests: ONE moto S3 server and ONE local Ray
cluster per session (starting either costs seconds). Config and prompt helpers live in
helpers.py.

Engines are real simulator processes launched by real Serve replicas, time-scaled so
a 4K-token completion takes tens of milliseconds.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from cluster.local_stack import create_bucket, start_s3
from serve_apps.engine_process import free_port
from tests.integration.helpers import BUCKET
from tests.support import sglang_cpu

# The warm start (jobs/pipeline/warmup.py) holds 3 x LIGHT_TASKS workers importing the
# pipeline in every session: on this 2-core box several CPU-seconds a session, taken from
# the engines and the other xdist worker. Off for the suite (drivers started as
# subprocesses inherit it); test_job_e2e runs its session with it on, as a user's runs
# are, and test_warmup tests the mechanism itself.
os.environ.setdefault("RAYGEN_WARM_START", "0")

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    log: Path  # moto's request log: one line a request


_SERVER: "S3Server | None" = None  # this xdist worker's, once started


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    port, log_dir = free_port(), tmp_path_factory.mktemp("moto")
    proc = start_s3(port, log_dir=log_dir)
    create_bucket(BUCKET, port)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["RAYGEN_S3_ENDPOINT"] = endpoint
    global _SERVER
    _SERVER = S3Server(endpoint, log_dir / f"moto-{port}.log")
    yield _SERVER
    _SERVER = None
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_endpoint(s3_server) -> str:
    return s3_server.endpoint


@pytest.fixture(scope="module", autouse=True)
def empty_the_bucket_after_the_module():
    """moto lists a prefix by scanning every key of its bucket: a bucket holding every
    earlier module's runs (thousands of keys late in the suite) made each listing (every
    progress tick lists its run's folders) ~4x dearer (20 ms against 5 ms of moto's CPU).
    Nothing one module writes is read by another: its keys go when it is done."""
    yield
    if _SERVER is None:
        return
    import boto3
    s3 = boto3.client("s3", endpoint_url=_SERVER.endpoint)
    try:  # every key listed first: deleting between pages could make the listing skip some
        keys = [{"Key": o["Key"]} for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET) for o in page.get("Contents", [])]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1,000 keys a request
            s3.delete_objects(Bucket=BUCKET, Delete={"Objects": keys[start:start + 1000],
                                                     "Quiet": True})
    except Exception:  # noqa: BLE001 - a cleanup, never a test failure
        pass


@pytest.fixture(scope="session")
def ray_cluster(s3_endpoint, tmp_path_factory):
    import ray
    # Ray writes its Grafana dashboards here and keeps raygen's next to them, as
    # cluster/ configures it (dashboards/README.md "What appears where").
    grafana_dir = tmp_path_factory.mktemp("grafana-dashboards")
    shutil.copy(REPO / "dashboards" / "grafana" / "raygen.json", grafana_dir)
    os.environ["RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"] = str(grafana_dir)
    # Fixed default ports of Ray's own metrics servers would collide with any other
    # Ray cluster on a dev machine; the processes Ray starts inherit these.
    os.environ["DASHBOARD_METRIC_PORT"] = str(free_port())
    os.environ["AUTOSCALER_METRIC_PORT"] = str(free_port())
    # Ray's housekeeping at a test's pace, not a production cluster's, on a 2-core machine
    # where every CPU-second idles a test (tests/README.md, Time budget):
    os.environ.update({
        # the log monitor globs the session's log folder every 0.1 s while it holds fewer
        # than 1,000 files (the suite's clusters start hundreds of workers): every 5 s
        # instead (log_to_driver is off; the files are all there for a test to read)
        "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "5",
        # Serve's controller reconciles every 0.1 s: 0.3 s (a deploy or a replica's
        # replacement a few tenths of a second later)
        "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.3",
        # no 8 workers prestarted for the first driver: sessions start the few they use
        "RAY_prestart_worker_first_driver": "0",
    })
    # More logical CPUs than cores: every raygen stage reserves a fraction of a CPU and
    # is I/O-bound; this only lets the scheduler place them.
    ctx = ray.init(address="local", num_cpus=8, include_dashboard=True, dashboard_host="127.0.0.1",
                   dashboard_port=free_port(),  # a dev machine may run another cluster
                   ignore_reinit_error=True, log_to_driver=False)
    os.environ["RAY_ADDRESS"] = ctx.address_info["gcs_address"]
    yield ctx
    from ray import serve
    serve.shutdown()
    ray.shutdown()


# Serve apps that tests of many modules share (one deploy per xdist worker). Any other app
# a module deploys is deleted when the module is done: an idle app's replicas and engines
# still poll each other (health checks, the metrics relay), and on this 2-core machine a
# dozen of them left running took a few tenths of a core from every later test. The real-
# engine folder's pools are shared too: their package fixtures delete them when the folder
# is done (deleted with the first module that used the speculative one, it was deployed
# again by the next: one more engine start, ~30 CPU-s).
SHARED_APPS = frozenset({"raygen-test", "raygen-slow", sglang_cpu.APP, sglang_cpu.SPEC_APP,
                         sglang_cpu.SMALL_POOL_APP})


def _serve_apps() -> set[str]:
    import ray
    if not ray.is_initialized():
        return set()
    from ray import serve
    try:
        return set(serve.status().applications)
    except Exception:  # noqa: BLE001 - no Serve yet, or a cluster of the test's own
        return set()


@pytest.fixture(scope="module", autouse=True)
def delete_the_modules_serve_apps():
    before = _serve_apps()
    yield
    from ray import serve
    for name in _serve_apps() - before - SHARED_APPS:
        try:  # not blocking: the controller stops the replicas while the next test runs
            serve.delete(name, _blocking=False)
        except Exception:  # noqa: BLE001 - a cleanup, never a test failure
            pass
