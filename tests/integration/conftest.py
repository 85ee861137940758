"""Shared real parts for integration tests: ONE moto S3 server and ONE local Ray
cluster per session (starting either costs seconds). Config and prompt helpers live in
helpers.py.

Engines are real simulator processes launched by real Serve replicas, time-scaled so
a 4K-token completion takes tens of milliseconds.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cluster.local_stack import create_bucket, start_s3
from serve_apps.engine_process import free_port
from tests.integration.helpers import BUCKET

# The warm start (jobs/pipeline/warmup.py) holds 3 x LIGHT_TASKS workers importing the
# pipeline in every session: on this 2-core box several CPU-seconds a session, taken from
# the engines and the other xdist worker. Off for the suite (drivers started as
# subprocesses inherit it); test_job_e2e runs its session with it on, as a user's runs
# are, and test_warmup tests the mechanism itself.
os.environ.setdefault("RAYGEN_WARM_START", "0")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory) -> str:
    port = free_port()
    proc = start_s3(port, log_dir=tmp_path_factory.mktemp("moto"))
    create_bucket(BUCKET, port)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["RAYGEN_S3_ENDPOINT"] = endpoint
    yield endpoint
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)


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
