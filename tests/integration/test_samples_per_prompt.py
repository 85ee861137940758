"""job.samples_per_prompt: 4 on the simulator engines (real Ray, moto S3): the driver is
SIGKILLed once parts are durable and the run resumed; every (key, sample) is then in
data/ exactly once, each sample with its own seed (the one jobs/io/samples.py derives)
and its own output; its truncated samples are continued per sample; finalize writes one
row per (key, sample) and export one record per (key, sample) with its sample.

The run is a sampling mix (job.sampling a list), mostly thinking off: each sample's
setting is the one jobs/pipeline/sampling_mix.py draws from (key, sample) and the run's
salt, the same after the kill and in the continuation; the thinking-off rows' prompts end
in the empty think block and their whole output is the answer, unflagged (before raygen
knew thinking off each was missing_think_end, and a 3-of-4 share would have drained the
replicas and tripped the fleet-wide flag breaker); the report and the export split by
setting; a resume with another mix is refused before any engine is deployed."""

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
from jobs.pipeline.sampling_mix import draw
from jobs.runs.run import RunError
from serve_apps.engines.simulator import tokenizer as tk
from tests.integration.helpers import (generate_cmd, generate_main, read, run, run_config,
                                       slowed, store_of, write_prompts)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
PROMPTS, SAMPLES = 40, 4
MIX = [{"name": "think", "weight": 1, "temperature": 0.6},
       {"name": "direct", "weight": 3, "temperature": 0.7, "top_p": 0.8, "thinking": False}]


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
                           "batch_size": 8, "inflight_rows_per_actor": 16, "sampling": MIX})
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
    _assert_settings(data, salt)

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
        assert row["setting"] == before.loc[at, "setting"]
        assert row["reasoning"] == "" or row["setting"] == "think"
        assert list(row["output_token_ids"][:len(before.loc[at, "output_token_ids"])]) == \
            list(before.loc[at, "output_token_ids"])

    # finalize: one row per (key, sample); export: one record per (key, sample)
    manifest = finalize(store)
    assert manifest["row_count"] == PROMPTS * SAMPLES and manifest["complete"]
    final = pa.concat_tables(pq.read_table(store.loc("final", f["name"]).path,
                                           filesystem=store.root.fs)
                             for f in manifest["files"]).to_pandas()
    assert not final.duplicated(["key", "sample"]).any()
    _assert_settings(final, salt)
    by_setting = store.read_json("report.json")["by_setting"]
    assert {k: g["rows"] for k, g in by_setting.items()} == latest["setting"].value_counts(
    ).to_dict()
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

    # the mix: the export keeps one setting's records, naming it; another mix is refused
    direct = tmp_path / "direct"
    assert cli.main(["export", str(store.uri), "--config", str(tmp_path / "samples.yaml"),
                     "--format", "messages", "--out", str(direct), "--include-truncated",
                     "--setting", "direct", "--extra-columns", "setting"]) == 0
    kept = [json.loads(line) for f in sorted(direct.glob("part-*.jsonl"))
            for line in f.read_text().splitlines()]
    assert len(kept) == (latest["setting"] == "direct").sum()
    assert all(r["setting"] == "direct" and r["messages"][-1]["reasoning_content"] == ""
               for r in kept)
    other = json.loads(json.dumps(tree))
    other["job"]["sampling"][1]["weight"] = 1
    with pytest.raises(RunError, match="settings"):
        run(other)


def _assert_settings(rows: pd.DataFrame, salt: bytes) -> None:
    """Each (key, sample) has the setting it draws; the thinking-off ones were rendered
    with the empty think block and are all answer, and no row carries a flag."""
    assert list(rows["setting"]) == [["think", "direct"][draw([1, 3], salt, k, int(s))]
                                     for k, s in zip(rows["key"], rows["sample"])]
    assert rows["settings_hash"].nunique() == 1  # the mix as a whole
    per_prompt = rows.groupby("key")["setting"].nunique()
    assert (per_prompt > 1).any()  # a prompt's samples draw on their own
    direct = rows[rows["setting"] == "direct"]
    assert len(direct) > len(rows) / 2
    for ids, out, reasoning, answer in zip(direct["prompt_token_ids"],
                                           direct["output_token_ids"],
                                           direct["reasoning"], direct["answer"]):
        assert tk.decode(list(ids)).endswith("<think>\n\n</think>\n\n")
        assert tk.THINK_END_ID not in list(out) and reasoning == "" and answer
    assert (direct["reasoning_tokens"] == 0).all() and direct["finished_thinking"].all()
    assert (rows.loc[rows["setting"] == "think", "reasoning"].str.len() > 0).all()
    assert not any(len(flags) for flags in rows["integrity_flags"])
