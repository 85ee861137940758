"""Shared real parts for integration tests: ONE moto S3 server and ONE local Ray
cluster per session (starting either costs seconds), plus config/prompt helpers.

Engines are real simulator processes launched by real Serve replicas, time-scaled so
a 4K-token completion takes tens of milliseconds.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from cluster.local_stack import create_bucket, start_s3
from serve_apps.engine_process import free_port

REPO = Path(__file__).resolve().parents[2]
BUCKET = "raygen-test"
FAST_SIM = {"time_scale": 0.002, "accept_length": 3.0}


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


def run_config(tmp_path: Path, s3_endpoint: str, *, rows_file: str, run_name: str = "",
               app_name: str = "raygen-test", output: str = "", **sections: Any) -> dict:
    """A RunConfig tree for tests: simulator engines, fast time scale, S3 output."""
    tree: dict[str, Any] = {
        "engine": {"kind": "simulator", "model_path": "sim-test", "context_length": 16384,
                   "max_running_requests": 32, "start_timeout_s": 60,
                   "request_timeout_s": 120,
                   "speculative": {"algorithm": "NEXTN"}, "simulator": dict(FAST_SIM)},
        "serve": {"app_name": app_name, "max_ongoing_requests": 128,
                  "num_cpus_per_replica": 0.1, "health_check_period_s": 1,
                  "health_check_timeout_s": 5,
                  "autoscaling": {"min_replicas": 2, "max_replicas": 2,
                                  "target_ongoing_requests": 32}},
        "job": {"input": rows_file, "output": output or f"s3://{BUCKET}/runs",
                "run_name": run_name or f"t-{uuid.uuid4().hex[:8]}",
                "max_new_tokens": 4096, "batch_size": 16, "rows_per_file": 64,
                "inflight_rows_per_actor": 96, "max_actors": 1,
                "progress_interval_s": 1, "metrics_linger_s": 0,
                # tests feed many bad lines to few rows on purpose; test_dry_run.py
                # tests the guard itself
                "max_reject_fraction": 1.0,
                "retries": {"max_attempts": 3, "backoff_initial_s": 0.05,
                            "backoff_max_s": 0.2}},
        "storage": {"endpoint_url": s3_endpoint},
    }
    for section, values in sections.items():
        tree[section] = _merge(tree.get(section, {}), values)
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


def write_prompts(path: Path, n: int, start: int = 0, with_ids: bool = True,
                  extra_lines: list[str] | None = None) -> Path:
    cats = ["coding", "reasoning", "multi_turn", "tool_calling"]
    with open(path, "w") as f:
        for i in range(start, start + n):
            row: dict[str, Any] = {
                "category": cats[i % len(cats)],
                "messages": [{"role": "user", "content": f"Prompt {i}: explain step {i % 7} "
                              f"of problem {i * 7919 % 1000} in detail."}]}
            if with_ids:
                row["id"] = f"p{i:05d}"
            f.write(json.dumps(row) + "\n")
        for line in extra_lines or []:
            f.write(line + "\n")
    return path
