"""job.samples_per_prompt: 4 on the simulator engines (real Ray, moto S3): the driver is
SIGKILLed once parts are durable and the run resumed; every (key, sample) is then in
data/ exactly once, each sample with its own seed (the one jobs/io/samples.py derives)
and its own output; its truncated samples are continued per sample; finalize writes one
row per (key, sample) and export one record per (key, sample) with its sample."""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import cli
from jobs.analysis.finalize import finalize
from jobs.io.samples import sample_seed
from tests.integration.helpers import (generate_cmd, generate_main, read, run, run_config,
                                       slowed, store_of, write_prompts)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
PROMPTS, SAMPLES = 40, 4


def _latest(tree: dict) -> pd.DataFrame:
    data = read(tree, "data")
    data = data.sort_values(["key", "sample", "version"]).drop_duplicates(
        ["key", "sample"], keep="last")
    return data.set_index(["key", "sample"])


def _assert_every_sample_once(tree: dict) -> pd.DataFrame:
    data = read(tree, "data")
    first = data[data["version"] == 0]
    assert len(first) == PROMPTS * SAMPLES, (len(first), read(tree, "failures").head(3))
    assert not first.duplicated(["key", "sample"]).any()
    assert not data.duplicated(["key", "sample", "version"]).any()
    counts = first.groupby("key")["sample"].apply(sorted)
    assert len(counts) == PROMPTS and all(s == list(range(SAMPLES)) for s in counts)
    assert read(tree, "failures").empty
    return data


@pytest.mark.slow
def test_four_samples_killed_resumed_continued_finalized_and_exported(
        ray_cluster, s3_endpoint, tmp_path, capsys):
    rows = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      # 16 rows in flight: the samples come back in waves, not all
                      # at once, so the kill after the first durable parts is mid-run
                      job={"samples_per_prompt": SAMPLES, "rows_per_file": 16,
                           "batch_size": 8, "inflight_rows_per_actor": 16})
    store = store_of(tree)
    cmd = generate_cmd(tmp_path / "samples.yaml", tree)

    def durable() -> int:
        return (store.read_json("progress.json") or {}).get("completed", 0)
    with slowed(tree):  # the kill lands mid-run; the resume runs at full speed
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: durable() > 0 or first.poll() is not None, 180, "first parts")
        first.send_signal(signal.SIGKILL)
        first.wait()
    killed_with = durable()
    assert first.returncode == -signal.SIGKILL, "the kill should land mid-run"
    assert killed_with < PROMPTS * SAMPLES, "rows must be left for the resume"
    # The resume in this process: only the killed driver needs one of its own.
    capsys.readouterr()
    assert generate_main(cmd[3:]) == 0
    resumed = capsys.readouterr()
    # the resume's summary counts (key, sample) rows as samples, not as prompts
    assert re.search(rf"(\d+) rows written: \1 new samples, {SAMPLES} per prompt",
                     resumed.out + resumed.err), resumed.out[-2000:]
    print(f"killed with {killed_with} of {PROMPTS * SAMPLES} (key, sample) rows durable")
    data = _assert_every_sample_once(tree)
    progress = store.read_json("progress.json")
    assert (progress["total"], progress["completed"]) == (PROMPTS * SAMPLES,) * 2

    # each sample its own seed, the one derived for it, and its own output
    salt = store.key_salt
    assert all(seed == sample_seed(salt, key, int(s))
               for key, s, seed in zip(data["key"], data["sample"], data["seed"]))
    for _, group in data.groupby("key"):
        assert group["seed"].nunique() == SAMPLES
        assert len({tuple(ids) for ids in group["output_token_ids"]}) == SAMPLES

    # a rerun has nothing to do; a continuation extends each truncated sample alone
    cut = data[data["finish_reason"] == "length"]
    assert len(cut) > 0, "the story's length distribution truncates some samples"
    summary = run(tree, continue_truncated=True, max_total_tokens=8192)
    assert summary.status == "succeeded", summary.text
    latest = _latest(tree)
    assert len(latest) == PROMPTS * SAMPLES
    continued = latest[latest["version"] == 1]
    assert set(continued.index) == set(zip(cut["key"], cut["sample"]))
    before = cut.set_index(["key", "sample"])
    for at, row in continued.iterrows():  # its seed kept, its own earlier output extended
        assert row["seed"] == before.loc[at, "seed"]
        assert list(row["output_token_ids"][:len(before.loc[at, "output_token_ids"])]) == \
            list(before.loc[at, "output_token_ids"])

    # finalize: one row per (key, sample); export: one record per (key, sample)
    manifest = finalize(store)
    assert manifest["row_count"] == PROMPTS * SAMPLES and manifest["complete"]
    final = pa.concat_tables(pq.read_table(store.loc("final", f["name"]).path,
                                           filesystem=store.root.fs)
                             for f in manifest["files"]).to_pandas()
    assert not final.duplicated(["key", "sample"]).any()
    assert final.groupby("key").size().eq(SAMPLES).all()
    out = tmp_path / "pretok"
    assert cli.main(["export", str(store.uri), "--config", str(tmp_path / "samples.yaml"),
                     "--format", "pretokenized", "--out", str(out),
                     "--include-truncated"]) == 0
    print(capsys.readouterr().out)  # the export's summary, for the record
    records = [json.loads(line) for f in sorted(out.glob("part-*.jsonl"))
               for line in f.read_text().splitlines()]
    assert len(records) == PROMPTS * SAMPLES
    assert sorted((r["id"], r["sample"]) for r in records) == sorted(latest.index)
    for r in records:
        row = latest.loc[(r["id"], r["sample"])]
        assert r["input_ids"] == list(row["prompt_token_ids"]) + list(row["output_token_ids"])
