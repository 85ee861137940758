"""`ray job submit` for real, as the runbook tells users to run raygen: the Jobs API of a
Ray head started by the local stack's own code (cluster.local_stack.start_head: token
auth on, the dashboard on 127.0.0.1), the repository uploaded with `--working-dir .
--runtime-env cluster/runtime_env.yaml`, `python -m jobs.generate` as the entrypoint.

A job runs to `SUCCEEDED` and writes its rows; the package Ray unpacked on the cluster
holds the code and leaves out the venv, the tests and local state; an unauthenticated
client is refused, and a real `ray job submit` without the token (or with a wrong one)
exits non-zero and its entrypoint never runs; the dashboard listens on loopback only;
`ray job stop` of a second job leaves progress.json `stopped` and the run's lease
released. The head is this test's own (its own temp dir, ports and home, where no
token exists before the stack creates one), stopped by its own PIDs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from cluster import local_stack
from serve_apps.engine_process import free_port
from tests.integration.helpers import run_config, store_of, write_prompts, write_yaml
from tests.integration.two_node import RAY_BIN, TwoNodeCluster, _node_ports
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head(s3_endpoint, tmp_path_factory):
    """A one-node Ray head started by cluster.local_stack.start_head (as `make run` starts
    it), its dashboard (the Jobs API) on a free port. Its HOME is empty, and the auth
    settings of this environment are left out: the head runs authenticated only if the
    stack itself turns auth on and creates the token. `head.env` is then a client of the
    stack: RAY_AUTH_MODE=token and the stack's token file."""
    cluster = TwoNodeCluster.new()
    base = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH_")}
    base["HOME"] = str(tmp_path_factory.mktemp("home"))
    # `ray job stop` SIGKILLs 3 s after SIGTERM (Ray's RAY_JOB_STOP_WAIT_TIME_S): at a load
    # of ~25 on 2 cores a driver did not write `stopped` in 3 s. 20 s here: this trial is
    # about what the stop leaves; the 3 s kill itself is test_exactly_once's SIGTERM trial.
    base["RAY_JOB_STOP_WAIT_TIME_S"] = "20"
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    dashboard = free_port()
    try:
        local_stack.start_head(cluster.temp_dir, dashboard,
                               ["--port", str(free_port()), "--num-cpus", "8",
                                "--ray-client-server-port", str(free_port())] + _node_ports(),
                               env=base)
    except BaseException:
        cluster.stop()  # what it started so far must not outlive the test
        raise
    cluster.env = local_stack.ray_auth_env(base)
    cluster.address = f"http://127.0.0.1:{dashboard}"
    cluster.dashboard_port = dashboard
    try:
        yield cluster
    finally:
        cluster.stop()


def ray_job(head, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([RAY_BIN, "job", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**head.env, **env, "RAY_ADDRESS": head.address})


def submit(head, config: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    return ray_job(head, "submit", "--working-dir", ".", "--runtime-env",
                   "cluster/runtime_env.yaml", *extra, "--", "python", "-m", "jobs.generate",
                   "--config", str(config), **env)


# Both jobs that run use one Serve app and one engine setting: the second job attaches to
# the engines the first deployed instead of deploying two more replicas and simulators on
# this head. Slow enough (time_scale 0.02) that `ray job stop` lands mid-run; 40 rows
# still take seconds.
APP = "raygen-submit"
ENGINE = {"simulator": {"time_scale": 0.02}}


def test_a_submitted_job_runs_and_uploads_only_the_code(head, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 40)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name=APP, engine=ENGINE)
    done = submit(head, write_yaml(tmp_path / "run.yaml", tree))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "' succeeded" in done.stdout, done.stdout[-2000:]  # Ray's own verdict on the job
    assert "40 done of 40" in done.stdout
    assert len(store_of(tree).read_kind("data")) == 40

    # What Ray unpacked on the cluster: the code, none of the excluded folders.
    session = Path(head.temp_dir, "session_latest").resolve()
    (package,) = [p for p in (session / "runtime_resources" / "working_dir_files").iterdir()
                  if p.is_dir()]
    top = {p.name for p in package.iterdir()}
    assert {"jobs", "serve_apps", "contract", "cluster", "dashboards", "pyproject.toml"} <= top
    assert not top & {".venv", ".local", ".git", "tests", ".pytest_cache"}, top
    size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file())
    print(f"\nuploaded working_dir: {size / 2**20:.1f} MiB, top level {sorted(top)}")
    assert size < 30 * 2**20, f"the upload is {size / 2**20:.0f} MiB: an exclude is missing"


def test_the_jobs_api_refuses_a_client_without_the_token(head):
    request = urllib.request.Request(f"{head.address}/api/jobs/")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code in (401, 403)
    listed = ray_job(head, "list")  # the same call with the head's token: allowed
    assert listed.returncode == 0, listed.stderr[-2000:]


def _without_auth(env: dict) -> dict:
    return {k: v for k, v in env.items() if not k.startswith("RAY_AUTH_")}


def test_a_submission_without_the_token_is_refused_and_never_runs(head, tmp_path):
    assert (Path(head.env["HOME"]) / ".ray" / "auth_token").stat().st_mode & 0o777 == 0o600
    marker = tmp_path / "the-entrypoint-ran"
    job_id = f"raygen-noauth-{uuid.uuid4().hex[:8]}"
    submit_argv = [RAY_BIN, "job", "submit", "--no-wait", "--address", head.address,
                   "--submission-id", job_id, "--", "python", "-c",
                   f"open({str(marker)!r}, 'w').write('ran')"]
    clients = {
        # A plain client: Ray sends no token unless RAY_AUTH_MODE=token.
        "no token": _without_auth(head.env),
        "a wrong token": {**_without_auth(head.env), "RAY_AUTH_MODE": "token",
                          "RAY_AUTH_TOKEN": "0" * 64},
    }
    for who, env in clients.items():
        refused = subprocess.run(submit_argv, cwd=REPO, capture_output=True, text=True,
                                 timeout=120, env=env)
        out = refused.stdout + refused.stderr
        assert refused.returncode != 0, f"{who}: submitted\n{out[-2000:]}"
        assert ("401" in out or "403" in out or "Unauthorized" in out
                or "Forbidden" in out), f"{who}: {out[-2000:]}"
    # The cluster never took it: the token's client finds no such job, nothing ran.
    status = ray_job(head, "status", job_id, timeout=120)
    assert status.returncode != 0 and "does not exist" in status.stdout + status.stderr, \
        status.stdout[-2000:] + status.stderr[-2000:]
    listed = ray_job(head, "list", timeout=120)
    assert listed.returncode == 0 and job_id not in listed.stdout, listed.stderr[-2000:]
    assert not marker.exists()


def _listen_addresses(port: int) -> set[str]:
    """Local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                found.add(address)
    return found


def test_the_stacks_dashboard_listens_on_loopback_only(head):
    # 0100007F = 127.0.0.1 (little-endian hex); 00000000 would be every interface.
    assert _listen_addresses(head.dashboard_port) == {"0100007F"}


def test_ray_job_stop_leaves_the_run_stopped_and_its_lease_released(head, s3_endpoint,
                                                                    tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 400)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name=APP, engine=ENGINE,
                      job={"rows_per_file": 16, "batch_size": 8, "inflight_rows_per_actor": 16})
    job_id = f"raygen-stop-{uuid.uuid4().hex[:8]}"
    started = submit(head, write_yaml(tmp_path / "run.yaml", tree), "--no-wait",
                     "--submission-id", job_id)
    assert started.returncode == 0, started.stderr[-2000:]
    store = store_of(tree)
    wait_until(lambda: (store.read_json("progress.json") or {}).get("completed", 0) > 0,
               240, "the submitted run's first durable rows")
    assert store.read_json("lease.json") is not None  # held while it runs
    stopped = ray_job(head, "stop", job_id)
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    wait_until(lambda: (store.read_json("progress.json") or {}).get("status") == "stopped", 60,
               "progress.json to say stopped")
    wait_until(lambda: store.read_json("lease.json") is None, 30, "the lease to be released")
    assert f"Job {job_id!r} was stopped" in ray_job(head, "status", job_id).stdout
    assert 0 < store.read_json("progress.json")["completed"] < 400
