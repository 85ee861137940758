"""Serve replicas supervising real engine processes: a dead engine fails the health
check, Serve replaces the replica, and deleting the app leaves no engine behind."""

from __future__ import annotations

import os
import signal

import pytest
from ray import serve

from serve_apps.app import deploy_or_attach
from contract.config import ServeConfig, SimulatorEngineConfig
from tests.support.engines import generate_request, group_pids
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _info_or_none(handle):
    try:
        return handle.info.remote().result(timeout_s=5)
    except Exception:
        return None


def test_engine_crash_restarts_replica_and_delete_leaves_no_orphan(ray_cluster):
    engine = SimulatorEngineConfig(kind="simulator", model_path="sim-crash", context_length=8192,
                          simulator={"time_scale": 0.001})
    cfg = ServeConfig(app_name="crash-test", health_check_period_s=1, health_check_timeout_s=5,
                      num_cpus_per_replica=0.1,
                      autoscaling={"min_replicas": 1, "max_replicas": 1})
    handle = deploy_or_attach(engine, cfg)
    first = handle.info.remote().result()
    assert handle.generate.remote(generate_request()).result()["error_class"] is None

    os.killpg(first["engine_pid"], signal.SIGKILL)  # a GPU fault takes the engine down
    second = wait_until(lambda: (i := _info_or_none(handle)) and i["replica"] != first["replica"]
                   and i, 90, "Serve to replace the replica")
    assert second["engine_pid"] != first["engine_pid"]
    assert handle.generate.remote(generate_request()).result()["error_class"] is None

    serve.delete("crash-test")
    wait_until(lambda: not group_pids(second["engine_pid"]), 30, "the engine to stop")
