"""Export while generating: `raygen export --incremental` to S3 during a real run
(Serve replicas, simulator engines, moto S3) and after it, then after a continuation;
read back as a trainer would (every batch's shards minus what later batches supersede)."""

from __future__ import annotations

import io
import json
import threading

import boto3
import pytest

from jobs import cli
from jobs.analysis import export_journal as ej
from jobs.analysis import incremental_export as ie
from jobs.analysis.export import Filters
from jobs.io.storage import locate
from tests.integration.helpers import (BUCKET, CLEAR_FAULTS, deploy, engine_urls, read, run,
                                       run_config, set_faults, store_of, write_prompts,
                                       write_yaml)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
APP = "raygen-test"
INCLUDE = Filters(include_truncated=True)


def trainer_view(endpoint: str, prefix: str) -> tuple[list[dict], dict[str, dict]]:
    """(batch manifests, id -> live record): the README's rule, on S3; a key live twice
    fails."""
    s3 = boto3.client("s3", endpoint_url=endpoint)
    body = lambda key: s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()  # noqa: E731
    names = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
                   .get("Contents", []) if o["Key"].endswith(".manifest"))
    batches = [json.loads(body(name)) for name in names]
    skip = {(int(b), k) for m in batches for b, keys in m["supersedes"].items() for k in keys}
    live: dict[str, dict] = {}
    for m in batches:
        for f in m["files"]:
            for line in io.BytesIO(body(f"{prefix}/{f['name']}")).read().splitlines():
                record = json.loads(line)
                if (m["batch"], record["id"]) not in skip:
                    assert record["id"] not in live, f"{record['id']} live twice"
                    live[record["id"]] = record
    return batches, live


def assert_latest(tree: dict, live: dict[str, dict]) -> None:
    """Every key of the run once, as its latest version's ids."""
    data = read(tree, "data").sort_values(["key", "version"])
    latest = data.drop_duplicates("key", keep="last").set_index("key")
    assert sorted(live) == sorted(latest.index)
    for key, record in live.items():
        row = latest.loc[key]
        assert record["input_ids"] == list(row.prompt_token_ids) + list(row.output_token_ids)


def test_exports_during_a_live_run_and_after_hold_each_key_once_at_its_latest(
        ray_cluster, s3_endpoint, tmp_path, capsys):
    rows = write_prompts(tmp_path / "p.jsonl", 40)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"rows_per_file": 8, "batch_size": 8})
    cfg, store = write_yaml(tmp_path / "run.yaml", tree), store_of(tree)
    prefix = f"exports/{tree['job']['run_name']}/inc"
    argv = ["export", "--config", str(cfg), "--format", "pretokenized", "--out",
            f"s3://{BUCKET}/{prefix}", "--incremental", "--include-truncated"]
    deploy(tree)
    urls = engine_urls(APP, 2)
    set_faults(urls, slow_rate=1.0, slow_factor=8.0)  # a run long enough to export into
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(summary=run(tree)))
    runner.start()
    try:
        wait_until(lambda: store.part_paths("data") or not runner.is_alive(), 120,
                   "the first data part")
        status = (store.read_json("progress.json") or {}).get("status")
        assert cli.main(argv) == 0  # during the run
        first = ej.read_journal(locate(f"s3://{BUCKET}/{prefix}", store.storage))
        seen = first.batches[0]["watermark"]["data_parts"]
        wait_until(lambda: len(store.part_paths("data")) > seen or not runner.is_alive(),
                   120, "a data part the first export did not see")
        # two exports at once: one may be refused (the lock), neither writes a row twice
        status += "/" + str((store.read_json("progress.json") or {}).get("status"))
        results: list = []

        def export_now():
            try:
                results.append(ie.export_incremental(
                    store, f"s3://{BUCKET}/{prefix}", "pretokenized", INCLUDE))
            except ej.JournalError as exc:
                results.append(exc)
        pair = [threading.Thread(target=export_now) for _ in range(2)]
        for t in pair:
            t.start()
        for t in pair:
            t.join()
        for r in results:
            assert not isinstance(r, Exception) or "is running" in str(r), r
        runner.join(timeout=300)
    finally:
        set_faults(urls, **CLEAR_FAULTS)
        runner.join(timeout=300)
    assert outcome["summary"].status == "succeeded"
    assert cli.main(argv) == 0  # after the run
    batches, live = trainer_view(s3_endpoint, prefix)
    assert_latest(tree, live)
    exported_v0 = set(live)
    # continue the truncated rows: their new versions supersede the v0 records
    assert run(tree, continue_truncated=True, max_total_tokens=8192).status == "succeeded"
    assert cli.main(argv) == 0
    assert "supersedes:" in capsys.readouterr().out
    batches, live = trainer_view(s3_endpoint, prefix)
    assert_latest(tree, live)
    data = read(tree, "data")
    continued = set(data[data.version == 1].key)
    last = batches[-1]
    assert continued and continued <= exported_v0
    assert sorted(k for keys in last["supersedes"].values() for k in keys) == sorted(continued)
    assert last["rows"] == len(continued) and last["live_keys"] == len(live) == 40
    assert len(batches) >= 2  # the first export's, the continuation's (others: what was new)
    pair_rows = ["refused" if isinstance(r, Exception) else r and r["rows"] for r in results]
    print(f"{len(batches)} batches, rows {[m['rows'] for m in batches]}, first export "
          f"and the pair while the run was {status}; the pair: {pair_rows}")
