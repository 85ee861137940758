"""End to end: real Ray, real Serve replicas supervising real simulator processes,
moto S3 over HTTP for input and output; the Parquet read back with pandas."""

from __future__ import annotations

import copy
import io
import json
import os
import re

import boto3
import pandas as pd
import pyarrow.parquet as pq
import pytest

from jobs.config import parse_config
from jobs.pipeline.settings import RunMode
from jobs.runs.run import RunError, run_job
from jobs.io.schema import DATA
from tests.integration.helpers import BUCKET, run_config, write_prompts

pytestmark = pytest.mark.integration


class _Never(Exception):
    pass


def _read_parquet_prefix(endpoint: str, prefix: str) -> pd.DataFrame:
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]
    frames = [pq.read_table(io.BytesIO(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()))
              .to_pandas() for k in keys if k.endswith(".parquet")]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@pytest.fixture(scope="module")
def e2e_run(ray_cluster, s3_endpoint, tmp_path_factory):
    """One 120-row run from S3 input (the tests below check different things of it)."""
    tmp_path = tmp_path_factory.mktemp("e2e")
    local = write_prompts(tmp_path / "prompts.jsonl", 120)
    boto3.client("s3", endpoint_url=s3_endpoint).upload_file(
        str(local), BUCKET, "inputs/e2e.jsonl")
    tree = run_config(tmp_path, s3_endpoint, rows_file=f"s3://{BUCKET}/inputs/e2e.jsonl",
                      run_name="e2e")
    before = os.environ.get("RAYGEN_WARM_START")
    os.environ["RAYGEN_WARM_START"] = "1"  # the default a user runs with (off for the suite)
    try:
        summary = run_job(parse_config(tree), RunMode(), stop_exc=_Never)
    finally:
        if before is None:
            os.environ.pop("RAYGEN_WARM_START", None)
        else:
            os.environ["RAYGEN_WARM_START"] = before
    return tree, summary


def test_job_writes_one_row_per_prompt_to_s3(e2e_run, s3_endpoint):
    tree, summary = e2e_run
    cfg = parse_config(tree)
    assert summary.status == "succeeded"

    df = _read_parquet_prefix(s3_endpoint, "runs/e2e/data/")
    assert len(df) == 120 and df["key"].is_unique
    assert sorted(df["id"]) == [f"p{i:05d}" for i in range(120)]
    assert list(df.columns) == DATA.names
    assert set(df["finish_reason"]) == {"stop", "length"}
    cut = df[df.finish_reason == "length"]
    assert (cut["completion_tokens"] == 4096).all()
    assert (df["completion_tokens"] == df["output_token_ids"].map(len)).all()
    assert (df["replica"].nunique() == 2), "both replicas should serve rows"
    assert df["accept_length"].between(1, 5).all()
    # The reasoning/answer split follows </think> in the text.
    done = df[df.finished_thinking]
    assert (done["answer"].str.len() > 0).all()
    # Progress counts agree with the output.
    p = summary.progress
    assert (p["completed"], p["truncated"]) == (120, len(cut))
    assert p["output_tokens"] == int(df["completion_tokens"].sum())
    # The engines' idle GPU-seconds, from their own idle counters, in progress.json too.
    body = boto3.client("s3", endpoint_url=s3_endpoint).get_object(
        Bucket=BUCKET, Key="runs/e2e/progress.json")["Body"].read()
    idle = json.loads(body)["engine_idle_gpu_s"]
    assert idle == p["engine_idle_gpu_s"] and idle["engines"] >= 2  # + any just replaced
    parts = idle["ramp"] + idle["tail"] + idle["restarts"] + idle["other"]
    assert idle["total"] >= 0 and abs(idle["total"] - parts) < 0.5  # each part rounded
    assert "  idle GPU:  " in summary.text

    # Rerun: resume finds everything durable and sends nothing.
    again = run_job(cfg, RunMode(), stop_exc=_Never)
    assert again.progress["session_rows"] == 0
    assert len(_read_parquet_prefix(s3_endpoint, "runs/e2e/data/")) == 120


def test_the_runs_objects_go_up_in_one_request_each_and_its_quarantine_in_one_listing(
        e2e_run, s3_server):
    """What the run asked of S3, from moto's request log: every object it wrote (parts,
    sidecars, progress.json, ...; none near a 10 MB upload part) in one PutObject, not a
    three-request multipart upload, and every look at its quarantine one listing of the
    folder, not one a kind (each progress tick looks)."""
    requests = [line for line in s3_server.log.read_text().splitlines()
                if "/runs/e2e/" in line or "prefix=runs/e2e/" in line]
    puts = [line for line in requests if '"PUT /' in line]
    assert len(puts) > 20, requests[:20]  # parts, sidecars, progress.json at every tick
    multipart = [line for line in requests if "?uploads" in line or "uploadId=" in line]
    assert not multipart, multipart[:5]
    quarantine = [line for line in requests if "prefix=runs/e2e/quarantine" in line]
    per_kind = [line for line in quarantine
                if re.search(r"prefix=runs/e2e/quarantine/(data|failures|rejects)", line)]
    assert quarantine and not per_kind, per_kind[:5]


def test_rerun_with_another_budget_is_refused(e2e_run):
    tree = copy.deepcopy(e2e_run[0])
    tree["job"]["max_new_tokens"] = 8192
    with pytest.raises(RunError, match="--continue-truncated --max-total-tokens 8192"):
        run_job(parse_config(tree), RunMode(), _Never)


def test_provenance_is_recorded_and_a_resume_says_what_changed(e2e_run, caplog):
    """provenance.json of the run above; a resume under other engine settings (not in
    settings_hash: the run goes on) logs each changed field and keeps the earlier record."""
    import logging

    from ray import serve

    from tests.integration.helpers import store_of
    tree = e2e_run[0]
    store = store_of(tree)
    rec = store.read_json("provenance.json")
    assert rec["format"] == 1 and rec["run"] == store.uri
    assert rec["model"] == {"path": "sim-test", "served_model_name": "sim-test",
                            "source": "simulator"}
    engine = rec["engine"]
    assert engine["kind"] == "simulator" and engine["version"] == "0.5.23-sim"
    assert engine["server_info"]["max_running_requests"] == 32  # from the engine itself
    assert engine["argv"][engine["argv"].index("--port") + 1] == "<port>"
    assert rec["speculative"]["algorithm"] == "NEXTN"
    assert rec["inputs"][0]["uri"] == f"s3://{BUCKET}/inputs/e2e.jsonl"
    assert rec["inputs"][0]["rows"] == 120
    assert rec["settings_hash"] and rec["raygen"]["version"]
    # A resume with 16 running requests per engine: its own app (the module's app keeps
    # its engine), one replica; nothing left to generate.
    changed = copy.deepcopy(tree)
    changed["engine"]["max_running_requests"] = 16
    changed["serve"]["app_name"] = "raygen-e2e-provenance"
    changed["serve"]["autoscaling"].update(min_replicas=1, max_replicas=1)
    caplog.set_level(logging.WARNING, logger="raygen")
    try:
        again = run_job(parse_config(changed), RunMode(), stop_exc=_Never)
    finally:
        serve.delete("raygen-e2e-provenance")
    assert again.status == "succeeded" and again.progress["session_rows"] == 0
    assert "provenance changed since the session of" in caplog.text
    assert "provenance: engine.server_info.max_running_requests: 32 -> 16" in caplog.text
    assert "provenance: engine.argv: --max-running-requests 32 -> 16" in caplog.text
    after = store.read_json("provenance.json")
    assert after["engine"]["server_info"]["max_running_requests"] == 16
    assert after["earlier"][-1]["fingerprint"] == rec["fingerprint"]
    assert "engine.argv" in after["sessions"][-1]["changed"]
