"""Operators' mistakes and systematic errors must not look like success: a 400 storm
ends `failed` with a non-zero exit, 429s are retried, a poison row fails alone on a
real replica, one job per run (real drivers, SIGKILL takeover), a throttling S3 and a
30 s outage behind proxies lose nothing."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from ray import serve

from bench.s3_faults import FlakyProxy, ThrottlingS3Proxy
from contract.outcomes import route
from contract.protocol import GenerateRequest
from jobs import generate
from jobs.analysis.status import holder_line
from tests.integration.helpers import (CLEAR_FAULTS, deploy, engine_urls, read, run, run_config,
                                       run_with_faults, set_faults, slowed, store_of,
                                       write_prompts, write_yaml)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
APP = "raygen-test"


def _assert_exactly_once(tree: dict, n: int) -> None:
    data = read(tree, "data")
    assert len(data) == n and data["key"].is_unique
    assert sorted(data["id"]) == [f"p{i:05d}" for i in range(n)]


@pytest.mark.slow
def test_400_storm_ends_failed_with_nonzero_exit(ray_cluster, s3_endpoint, tmp_path, capsys):
    rows = write_prompts(tmp_path / "p.jsonl", 150)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows))  # default breaker window
    cfg = write_yaml(tmp_path / "storm.yaml", tree)
    deploy(tree)
    urls = engine_urls(APP, 2)
    old_term = signal.getsignal(signal.SIGTERM)
    try:
        set_faults(urls, error_rate=1.0, error_status=400)
        code = generate.main(["--config", str(cfg)])  # the CLI itself, in this process
    finally:
        set_faults(urls, **CLEAR_FAULTS)
        signal.signal(signal.SIGTERM, old_term)
    err = capsys.readouterr().err
    assert code == 1  # before: "succeeded", exit 0, every row in failures/
    assert "non-transient error 'bad_request'" in err and "HTTP 400" in err
    assert "job.sampling" in err  # the fix
    assert store_of(tree).read_json("progress.json")["status"] == "failed"
    assert len(read(tree, "failures")) < 150, "stopped before the whole dataset failed"
    assert read(tree, "data").empty
    assert store_of(tree).read_json("lease.json") is None  # released on the way out


def test_429_is_retried_with_backoff(ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 60)
    # 12 tries at 30% faults: a row loses all of them with p = 0.3^12 (8 tries: 0.4% a run)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"retries": {"max_attempts": 12}})
    summary = run_with_faults(tree, APP, error_rate=0.3, error_status=429)
    assert summary.status == "succeeded"
    _assert_exactly_once(tree, 60)
    data = read(tree, "data")
    assert any("engine_busy" in list(c) for c in data["retry_classes"])
    assert read(tree, "failures").empty
    again = run(tree)  # a rerun of a complete run: a success with nothing to do
    assert again.status == "succeeded" and again.progress["session_rows"] == 0
    assert "nothing to do" in again.text


def test_poison_row_fails_alone_on_a_real_replica(ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 1)
    deploy(run_config(tmp_path, s3_endpoint, rows_file=str(rows)))

    def request(key, budget):
        return GenerateRequest(key=key, run="poison", category="c", max_new_tokens=budget,
                               sampling={}, messages=[{"role": "user", "content": f"hello {key}"}])

    # max_new_tokens=None makes the replica's own code raise (int(None)); before, the
    # whole call failed and its three good rows were retried as "replica_unavailable".
    stream = serve.get_app_handle(APP).options(stream=True)
    results = {r.key: r for r in stream.generate_many.remote(
        [request("a", 64), request("bad", None), request("b", 64), request("c", 64)])}
    assert set(results) == {"a", "bad", "b", "c"}
    assert all(results[k].error_class is None and results[k].output_token_ids
               for k in "abc")
    bad = results["bad"]
    assert bad.error_class == "replica_error" and not route(bad.error_class).retryable
    assert "TypeError" in bad.error_message


def _json(store, name: str) -> dict:
    """A run file the driver keeps rewriting; {} when absent or caught mid-rewrite (moto
    can serve an object torn while it is being replaced)."""
    try:
        return store.read_json(name) or {}
    except ValueError:
        return {}


def _driver(cfg, log):
    return subprocess.Popen([sys.executable, "-m", "jobs.generate", "--config", str(cfg)],
                            stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_one_job_per_run_and_takeover_after_sigkill(ray_cluster, s3_endpoint, tmp_path,
                                                    capsys):
    rows = write_prompts(tmp_path / "p.jsonl", 240)
    # The shared fast app, slowed (helpers.slowed) only while the driver to be killed runs:
    # at 32 rows in flight it is still mid-run (~15 s of generation) when the refused
    # driver is done, and the takeover session runs at full speed.
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"rows_per_file": 16, "batch_size": 8, "lease_timeout_s": 6,
                           "inflight_rows_per_actor": 32})
    cfg = write_yaml(tmp_path / "lease.yaml", tree)
    store = store_of(tree)
    with slowed(tree):
        first = _driver(cfg, open(tmp_path / "a.log", "w"))
        try:
            wait_until(lambda: _json(store, "progress.json").get("completed"), 180,
                      "the first driver to write rows")
            # jobs.analysis.status names the holder
            assert f"(pid {first.pid})" in holder_line(store)
            # The second and third drivers run in this process: only the killed one needs
            # its own (two interpreter starts fewer).
            capsys.readouterr()
            assert generate.main(["--config", str(cfg)]) == 1
            assert f"is held by job driver-{first.pid} on {socket.gethostname()} " \
                   f"(pid {first.pid}) since" in capsys.readouterr().err
            assert first.poll() is None, "the refused driver must not disturb the holder"
            first.send_signal(signal.SIGKILL)
            first.wait()
        finally:
            if first.poll() is None:
                first.kill()
    # Resubmitted on the host where it ran: its pid is dead, so no wait for the timeout.
    assert generate.main(["--config", str(cfg)]) == 0
    third = capsys.readouterr().out
    assert f"took over the lease of job driver-{first.pid}" in third
    assert "is gone" in third
    _assert_exactly_once(tree, 240)
    assert store.read_json("lease.json") is None


@pytest.mark.slow
def test_a_throttling_s3_and_a_30_s_outage_mid_run_are_ridden_out_exact(ray_cluster, s3_endpoint,
                                                                       tmp_path):
    """The store throttles 10% of requests (503 SlowDown / 500 with S3's XML bodies, each
    request delayed 10 ms), 30% once rows flow, and is cut off for 30 s mid-run: the
    session succeeds, exact, without a rerun; progress.json counts the retries. Before
    jobs/io/s3_retry.py the throttling alone ended the session (the SDK's INTERNAL_FAILURE
    on a throttled small read), and the fence at half of job.lease_timeout_s could end it
    on the outage."""
    throttle = ThrottlingS3Proxy(int(s3_endpoint.rsplit(":", 1)[1]), error_share=0.1,
                                 delay_s=0.01, seed=3)
    proxy = FlakyProxy(throttle.port)  # the run -> outage -> throttling -> moto
    rows = write_prompts(tmp_path / "p.jsonl", 160)
    # The shared fast app, slowed (helpers.slowed) for the session: most parts are still
    # to come when the outage starts. The 120 s lease timeout of earlier defaults: its
    # old fence (60 s) could close in a 30 s outage begun late in a renewal interval.
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"rows_per_file": 16, "batch_size": 8, "lease_timeout_s": 120})
    direct = store_of(tree)  # the test watches past the proxies
    tree["storage"]["endpoint_url"] = f"http://127.0.0.1:{proxy.port}"
    outcome: dict = {}

    def job():
        try:
            outcome["summary"] = run(tree)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    runner = threading.Thread(target=job)
    try:
        # Slowed until the store is back (most parts still to come at the outage); the
        # requests after it run at full speed, behind the same 30% throttling.
        with slowed(tree):
            runner.start()
            wait_until(lambda: direct.part_paths("data") or not runner.is_alive(), 180,
                       "the first data part")
            throttle.error_share = 0.3
            before = len(direct.part_paths("data"))
            proxy.outage()
            down_at = time.monotonic()
            wait_until(lambda: time.monotonic() - down_at >= 30 or not runner.is_alive(), 60,
                      "30 s of outage")
            assert runner.is_alive(), f"the run ended during the outage: {outcome}"
            proxy.restore()
        runner.join(timeout=300)
    finally:
        proxy.restore()
        if runner.ident is not None:
            runner.join(timeout=300)
        proxy.close()
        throttle.close()
    tree["storage"]["endpoint_url"] = s3_endpoint  # read the result past the proxies
    assert "error" not in outcome, outcome.get("error")
    assert outcome["summary"].status == "succeeded"
    assert proxy.refused > 0 and before < 160 / 16, "the outage must hit a run in progress"
    assert throttle.total_throttled() > 30
    _assert_exactly_once(tree, 160)
    assert read(tree, "failures").empty
    progress = direct.read_json("progress.json")
    assert progress["status"] == "succeeded" and progress["s3_retries"] > 0
    assert progress["s3_retries"] == sum(progress["s3_retries_by_kind"].values())


@pytest.mark.slow
def test_a_driver_that_cannot_renew_its_lease_stops_itself(ray_cluster, s3_endpoint, tmp_path):
    """The fence: with the store unreachable past half of job.lease_timeout_s, another
    job could take the run over, so the driver stops dispatching and exits by itself
    (before: it went on, and would have written beside the next holder)."""
    proxy = FlakyProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    rows = write_prompts(tmp_path / "p.jsonl", 160)
    # The shared fast app, slowed (helpers.slowed) only while the fenced driver runs (most
    # parts still to come at the outage); the resume runs at full speed.
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"rows_per_file": 16, "batch_size": 8, "lease_timeout_s": 4})
    direct = store_of(tree)
    tree["storage"]["endpoint_url"] = f"http://127.0.0.1:{proxy.port}"
    cfg = write_yaml(tmp_path / "fence.yaml", tree)
    log = tmp_path / "driver.log"
    with slowed(tree):
        driver = _driver(cfg, open(log, "w"))
        try:
            wait_until(lambda: direct.part_paths("data"), 180, "the first data part")
            proxy.outage()
            driver.wait(timeout=90)  # the outage lasts until the driver has ended
            output = log.read_text()
            assert driver.returncode == 1, output[-2000:]
            assert "stopped: the run's lease could not be renewed for" in output
            assert len(direct.part_paths("data")) < 160 / 16, "stopped before the end"
        finally:
            proxy.restore()
            if driver.poll() is None:
                driver.kill()
            proxy.close()
    # Its lease could not be deleted in the outage; its pid is gone, so no wait.
    tree["storage"]["endpoint_url"] = s3_endpoint
    summary = run(tree)
    assert summary.status == "succeeded" and "is gone" in summary.text
    _assert_exactly_once(tree, 160)
