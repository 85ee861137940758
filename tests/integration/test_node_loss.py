"""Node loss on a real two-node Ray cluster: node 2's raylet is SIGKILLed mid-run while
it holds Serve replicas, engines and Ray Data work. Its engines must die with it; the
job completes (Ray Data reschedules, Serve replaces the replica on the head) or fails
with a clean message; the rerun is exact. Then the cluster is stopped the way
`make stack-down` stops one (cluster.local_stack.stop_session) and no engine survives.

Runs jobs as real driver subprocesses (`python -m jobs.generate`), as users do."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from jobs.config import StorageConfig
from jobs.io.run_store import RunStore
from tests.integration.helpers import run_config, write_prompts
from tests.integration.helpers import write_yaml
from tests.integration.two_node import TwoNodeCluster, alive, run_name
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 160  # 4 parts of 16 durable before the kill, most rows still to come
JOB_TIMEOUT_S = 300


@pytest.fixture
def two_nodes():
    cluster = TwoNodeCluster.start(head_cpus=4, node2_cpus=4)
    yield cluster
    cluster.stop()  # idempotent: the test stops it first and checks the engines


def _driver(cluster: TwoNodeCluster, config, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jobs.generate", "--config", str(config)],
                            env=cluster.job_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _assert_exact(store: RunStore, keys: set[str]) -> None:
    """Every valid row once, every part readable, no good row rejected or failed."""
    counts: collections.Counter = collections.Counter()
    for path in store.part_paths("data"):
        counts.update(store.load_part(path, "data", ["key"]).column("key").to_pylist())
    assert set(counts) == keys, f"missing {len(keys - set(counts))} rows"
    assert [k for k, n in counts.items() if n > 1] == [], "rows written twice"
    assert store.part_paths("rejects") == []
    for path in store.part_paths("failures"):
        store.load_part(path, "failures", ["key"])  # readable


def test_node_loss_mid_run_then_exact_rerun_and_no_engine_survives(
        two_nodes, s3_endpoint, tmp_path):
    cluster = two_nodes
    prompts = write_prompts(tmp_path / "prompts.jsonl", ROWS)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(prompts), run_name=run_name(),
                      app_name="node-loss",
                      # Slow enough that the kill lands mid-run (~10-50 s of generation).
                      engine={"simulator": {"time_scale": 0.1}},
                      job={"rows_per_file": 16, "max_actors": 2})
    config = write_yaml(tmp_path / "job.yaml", tree)
    store = RunStore.for_run(tree["job"]["output"], tree["job"]["run_name"],
                             StorageConfig(**tree["storage"]))
    keys = {f"p{i:05d}" for i in range(ROWS)}

    with open(tmp_path / "first.log", "wb") as log:
        first = _driver(cluster, config, log)
        raylet2 = cluster.node2_raylet()
        wait_until(lambda: cluster.engines(under=[raylet2]) or first.poll() is not None,
                 180, "an engine on node 2")
        wait_until(lambda: len(store.part_paths("data")) >= 4 or first.poll() is not None,
                 180, "the first parts")
        assert first.poll() is None, "the job ended before the kill: slow it down"
        parts_at_kill = len(store.part_paths("data"))
        node2_engines = cluster.kill_node2()
        assert node2_engines, "node 2 held no engine: the kill proved nothing"
        # Raylet SIGKILL (node loss, machine up): node 2's engines die with it.
        wait_until(lambda: not [p for p in node2_engines if alive(p)], 60,
                 "node 2's engines to die")
        try:
            first_rc = first.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            first.kill()
            raise
    first_out = (tmp_path / "first.log").read_text(errors="replace")
    if first_rc != 0:  # failing is allowed; failing with a traceback as the last word is not
        tail = first_out.strip().splitlines()[-3:]
        assert any(line.startswith(("error:", "run ")) for line in tail), "\n".join(tail)

    with open(tmp_path / "rerun.log", "wb") as log:
        rerun = _driver(cluster, config, log)
        rerun_rc = rerun.wait(timeout=JOB_TIMEOUT_S)
    rerun_out = (tmp_path / "rerun.log").read_text(errors="replace")
    assert rerun_rc == 0, rerun_out[-3000:]
    _assert_exact(store, keys)
    print(f"trial: killed node 2 ({len(node2_engines)} engine(s)) at {parts_at_kill} data "
          f"parts; first run exit {first_rc}; rerun exact; quarantined {store.quarantined()}")

    # `make stack-down` / `ray stop` of this cluster: no engine survives it.
    engines = cluster.engines()
    assert engines, "the Serve app stays up after a job: its engines should be running"
    cluster.stop()
    wait_until(lambda: not [p for p in engines if alive(p)], 30, "the head's engines to die")
