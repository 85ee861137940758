"""GPU hours are protected before deploying: a mostly bad input never deploys its Serve
app, and `raygen generate --dry-run` on a run that already holds rows plans only the new
ones and leaves every object of the run untouched (real Ray, real moto S3)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
from ray import serve

from jobs import generate
from tests.integration.helpers import BUCKET, run_config, write_prompts
from tests.integration.helpers import read, run, store_of, write_yaml

pytestmark = pytest.mark.integration
BAD = ['{"id": "x1", "messages": [', "not json", '{"id": "x2", "messages": []}',
       '{"id": "p00001", "messages": [{"role": "user", "content": "again"}]}']


def test_a_mostly_bad_input_never_deploys_its_serve_app(ray_cluster, s3_endpoint, tmp_path,
                                                        capsys):
    rows = write_prompts(tmp_path / "p.jsonl", 4, extra_lines=BAD)
    app = f"dry-{uuid.uuid4().hex[:8]}"
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), app_name=app,
                      job={"max_reject_fraction": 0.05})
    config = write_yaml(tmp_path / "run.yaml", tree)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert generate.main(["--config", str(config)]) == 1
    finally:
        signal.signal(signal.SIGTERM, handler)  # jobs.generate installs its own
    err = capsys.readouterr().err
    assert err.startswith("error: 4 of 8 input rows (50.0%) were rejected, more than "
                          "job.max_reject_fraction=0.05: 2 x not valid JSON")
    assert f"1 x duplicate id (e.g. {rows}:8)" in err
    assert app not in serve.status().applications
    assert sorted(read(tree, "rejects").line) == [5, 6, 7, 8]  # written before stopping
    assert store_of(tree).read_json("progress.json")["status"] == "failed"
    assert read(tree, "data").empty


def _objects(endpoint: str, prefix: str) -> dict[str, tuple]:
    s3 = boto3.client("s3", endpoint_url=endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: (o["ETag"], o["LastModified"]) for page in pages
            for o in page.get("Contents", [])}


def _dry_run(config: Path, *flags: str) -> subprocess.CompletedProcess:
    raygen = Path(sys.executable).with_name("raygen")
    return subprocess.run([str(raygen), "generate", "--config", str(config), "--dry-run",
                           *flags], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a real 12-row run first, then three CLI processes
def test_dry_run_of_a_run_with_rows_plans_the_new_ones_and_writes_nothing(
        ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 12)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows))
    run(tree)
    write_prompts(rows, 17, extra_lines=['{"broken'])  # 5 new prompts and a bad line
    config = write_yaml(tmp_path / "run.yaml", dict(tree, job=dict(
        tree["job"], max_reject_fraction=0.1)))
    prefix = f"runs/{tree['job']['run_name']}/"
    before = _objects(s3_endpoint, prefix)

    plain = _dry_run(config)
    assert plain.returncode == 0, plain.stderr
    for line in ["input:     18 rows in 1 file(s), 17 distinct valid ids",
                 "rejects:   1 (1 not yet in rejects/): 1 x not valid JSON",
                 "guard:     5.6% rejected, limit job.max_reject_fraction=0.1: ok",
                 "done:      12 ids already in data/, 0 open failures",
                 "generate:  5 prompts now",
                 "budget:    job.max_new_tokens=4096",
                 f"replicas:  2..2 (serve.autoscaling min/max) of simulator engine "
                 f"'sim-test', Serve app '{tree['serve']['app_name']}'"]:
        assert line in plain.stdout, plain.stdout
    retry = _dry_run(config, "--retry-failed")  # allowed: nothing failed, nothing to send
    assert retry.returncode == 0 and "generate:  0 prompts now" in retry.stdout, retry.stderr
    budget = _dry_run(config, "--set", "job.max_new_tokens=8192")  # would mix budgets
    assert budget.returncode == 1 and "--continue-truncated --max-total-tokens 8192" in \
        budget.stderr, budget.stderr
    # no rejects, inputs.json, lease or progress written; nothing rewritten
    assert _objects(s3_endpoint, prefix) == before
