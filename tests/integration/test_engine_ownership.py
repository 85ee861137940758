"""A run owns the engines it uses (serve_apps/app_claims.py, the engine hash on every
result). On the shared Ray cluster:

- Run B with run A's serve.app_name and another engine setting, while A streams: B is
  refused before it deploys anything, naming A's run; A's replicas are untouched and A
  completes exactly. A is a driver of its own (another Ray job than B's, run in the test
  process: the claims are the cluster's, not a job's).
- The app redeployed under A outside raygen (as `serve deploy` or a RayService update
  would): A stops at the first row from the other engine, writes none of them, and the
  rerun completes exactly with A's own engine again. A's driver runs in the test process.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from jobs.config import parse_config
from jobs.runs.run import RunError
from tests.integration.helpers import (assert_run_exact, engine_urls, read, replica_infos, run,
                                       run_config, set_faults, store_of, write_prompts,
                                       write_yaml)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 240
APP = "raygen-owned"


def _tree(tmp_path, s3_endpoint, rows, time_scale: float, name: str = "", **job) -> dict:
    return run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name=APP, run_name=name,
                      engine={"simulator": {"time_scale": time_scale}},
                      job={"rows_per_file": 16, "batch_size": 8, "lease_timeout_s": 20, **job})


def _driver(tree: dict, tmp_path, name: str) -> subprocess.Popen:
    cfg = write_yaml(tmp_path / f"{name}.yaml", tree)
    return subprocess.Popen([sys.executable, "-m", "jobs.generate", "--config", str(cfg)],
                            stdout=open(tmp_path / f"{name}.log", "w"), stderr=subprocess.STDOUT)


def _in_thread(tree: dict) -> dict:
    """A session of ``tree`` in this process, in a thread not yet started: the dict gets
    its Summary ("summary") or the exception it ended in ("error")."""
    outcome: dict = {}

    def drive():
        try:
            outcome["summary"] = run(tree)
        except BaseException as exc:  # noqa: BLE001 - asserted by the caller
            outcome["error"] = exc
    outcome["thread"] = threading.Thread(target=drive, name=f"driver {tree['job']['run_name']}")
    return outcome


def _replica_hashes(foreign_to: str = "") -> dict[str, str]:
    """replica id -> engine hash of both replicas (with ``foreign_to``: of two replicas
    whose hash is not that one, as a rollout brings them)."""
    infos = replica_infos(APP, 2, 120, where=lambda i: i["engine_config_hash"] != foreign_to)
    return {r: i["engine_config_hash"] for r, i in infos.items()}


def _first_rows(store) -> int:
    return wait_until(lambda: (store.read_json("progress.json") or {}).get("completed", 0),
                      180, "the first durable rows")


def test_a_second_run_cannot_swap_a_live_runs_engines(ray_cluster, s3_endpoint, tmp_path):
    from serve_apps.app import deployed_engine_hash
    rows = write_prompts(tmp_path / "p.jsonl", ROWS)
    tree_a = _tree(tmp_path, s3_endpoint, rows, 0.01, "owner-a")
    tree_b = _tree(tmp_path, s3_endpoint, rows, 0.02, "other-b")  # another engine setting
    hash_a = deployed_engine_hash(parse_config(tree_a).engine)
    a = _driver(tree_a, tmp_path, "a")
    try:
        _first_rows(store_of(tree_a))
        with pytest.raises(RunError) as info:
            run(tree_b)
        message = str(info.value)
        print(f"\nrefused: {message.splitlines()[0]}")
        assert f"Serve app {APP!r} is in use by another live run" in message
        assert store_of(tree_a).uri in message  # names the run it would have disturbed
        assert set(_replica_hashes().values()) == {hash_a}  # A's engines, untouched
        assert a.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        if a.poll() is None:
            a.kill()
    assert_run_exact(tree_a, [f"p{i:05d}" for i in range(ROWS)])
    assert read(tree_b, "data").empty  # B wrote no row


def test_a_redeploy_outside_raygen_stops_the_run_before_a_foreign_row(ray_cluster,
                                                                      s3_endpoint, tmp_path):
    from ray import serve

    from serve_apps.app import build_app, deployed_engine_hash
    rows = write_prompts(tmp_path / "p.jsonl", ROWS)
    # Retried for minutes (400 tries, <= 1 s apart): A's rows outlast any rollout below.
    # 16 rows in flight an actor: most of A's rows are still to be sent when the faults
    # below start (at the default 128, all 240 were in flight at once and A finished on
    # its own engines).
    tree_a = _tree(tmp_path, s3_endpoint, rows, 0.01, "owner-c", inflight_rows_per_actor=16,
                   retries={"max_attempts": 400, "backoff_initial_s": 0.2,
                            "backoff_max_s": 1.0})
    other = parse_config(_tree(tmp_path, s3_endpoint, rows, 0.03))
    hash_a = deployed_engine_hash(parse_config(tree_a).engine)
    # A's driver runs in this process (in a thread; its session ends in RunError, the CLI's
    # exit 1): nothing here kills it, and a driver of its own is a Ray job of its own.
    outcome = _in_thread(tree_a)
    a = outcome["thread"]
    a.start()
    try:
        _first_rows(store_of(tree_a))
        # A's own engines answer every new request 503 (retried): no row A sends from now
        # on completes on them, however long the rollout below takes (31 s on a loaded CI
        # machine; slowing them, A once finished its last rows first). Every later row
        # is answered by the other engine.
        set_faults(engine_urls(APP, 2), error_rate=1.0, error_status=503)
        # What `serve deploy` / a RayService update does: no claim, just the new app.
        serve.run(build_app(other.engine, other.serve), name=APP, route_prefix=None)
        foreign = set(_replica_hashes(foreign_to=hash_a))
        a.join(timeout=300)
        assert not a.is_alive(), "A's session must end"
    finally:
        a.join(timeout=300)
    assert isinstance(outcome.get("error"), RunError), outcome  # the CLI's exit 1
    log = str(outcome["error"])
    assert f"not this run's {hash_a}: the app was redeployed under the run" in log, log[-3000:]
    data = read(tree_a, "data")
    assert 0 < len(data) < ROWS
    assert not set(data["replica"]) & foreign, "a row from the foreign engine was written"
    # The rerun finds no live claimant of the other engine: it deploys its own again.
    assert run(tree_a).status == "succeeded"
    assert set(_replica_hashes().values()) == {hash_a}
    assert_run_exact(tree_a, [f"p{i:05d}" for i in range(ROWS)])
