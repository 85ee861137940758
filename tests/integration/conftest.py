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
