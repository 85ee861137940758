"""Export end to end: a real run (Serve replicas, simulator engines, moto S3) whose input
mixes OpenAI, ShareGPT and content-part rows, continued once, then exported in every
format through the `raygen` command and read back the way trainers read it."""

from __future__ import annotations

import io
import json

import boto3
import datasets
import pytest

from jobs import cli
from jobs.pipeline.validate import prompt_key
from tests.integration.helpers import BUCKET, run_config, write_prompts
from tests.integration.helpers import read, run, write_yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHAREGPT = {"id": "sg-1", "category": "multi_turn", "conversations": [
    {"from": "human", "value": "Name a prime."}, {"from": "gpt", "value": "7"},
    {"from": "human", "value": "Why is it prime?"}]}
PARTS = {"category": "coding", "messages": [{"role": "user", "content": [
    {"type": "text", "text": "Write fizzbuzz "}, {"type": "text", "text": "in Python."}]}]}
TOOL_CALL = {"id": "c1", "type": "function", "function": {
    "name": "wx", "arguments": json.dumps({"city": "Oslo"})}}
TOOLS = {"id": "tool-1", "category": "tool_calling",
         "tools": [{"type": "function", "function": {"name": "wx", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}}}}],
         "messages": [{"role": "user", "content": "Umbrella in Oslo?"},
                      {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                      {"role": "tool", "content": "rain"},
                      {"role": "user", "content": "So?"}]}
ALPACA = {"instruction": "Add the numbers", "input": "2 3", "output": "5"}


@pytest.fixture(scope="module")
def finished_run(ray_cluster, s3_endpoint, tmp_path_factory):
    """A 41-row run (one reject) whose truncated rows were continued (their latest version is v1)."""
    tmp = tmp_path_factory.mktemp("export")
    rows = write_prompts(tmp / "prompts.jsonl", 37, extra_lines=[
        json.dumps(SHAREGPT), json.dumps(PARTS), json.dumps(TOOLS), json.dumps(ALPACA)])
    tree = run_config(tmp, s3_endpoint, rows_file=str(rows))
    assert run(tree).status == "succeeded"
    assert run(tree, continue_truncated=True, max_total_tokens=8192).status == "succeeded"
    data = read(tree, "data").sort_values(["key", "version"])
    assert data["version"].max() == 1, "the simulator truncates ~18% at 4096"
    latest = data.drop_duplicates("key", keep="last").set_index("key")
    return tree, write_yaml(tmp / "run.yaml", tree), latest, tmp


def s3_jsonl(endpoint: str, prefix: str) -> tuple[dict, list[dict]]:
    s3 = boto3.client("s3", endpoint_url=endpoint)
    body = lambda key: s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()  # noqa: E731
    manifest = json.loads(body(f"{prefix}/export.manifest"))
    records = [json.loads(line) for f in manifest["files"]
               for line in io.BytesIO(body(f"{prefix}/{f['name']}")).read().splitlines()]
    return manifest, records


def test_input_formats_reach_the_run_with_the_right_keys_and_reasons(finished_run):
    tree, _, latest, _ = finished_run
    assert json.loads(latest.loc["sg-1", "messages"])[1] == {"role": "assistant", "content": "7"}
    parts_key = prompt_key([{"role": "user", "content": "Write fizzbuzz in Python."}], None)
    assert parts_key in latest.index
    [reason] = read(tree, "rejects")["reason"]
    assert "looks like Alpaca" in reason


def test_pretokenized_to_s3_is_the_latest_versions_ids_exactly(finished_run, s3_endpoint,
                                                                 capsys):
    tree, cfg, latest, _ = finished_run
    prefix = f"exports/{tree['job']['run_name']}/pretok"
    assert cli.main(["export", "--config", str(cfg), "--format", "pretokenized",
                     "--out", f"s3://{BUCKET}/{prefix}", "--rows-per-file", "16"]) == 0
    print(capsys.readouterr().out)  # the summary, with rows/s, for the record
    manifest, records = s3_jsonl(s3_endpoint, prefix)
    stop = latest[latest.finish_reason == "stop"]
    assert sorted(r["id"] for r in records) == sorted(stop.index)
    assert manifest["dropped"] == {"integrity": 0, "finish_reason": len(latest) - len(stop)}
    assert manifest["older_versions_skipped"] == int((latest["version"] == 1).sum()) > 0
    for r in records:
        row = stop.loc[r["id"]]
        prompt, output = list(row.prompt_token_ids), list(row.output_token_ids)
        assert r["input_ids"] == prompt + output
        assert r["loss_mask"] == [0] * len(prompt) + [1] * len(output)
    assert [f["rows"] for f in manifest["files"]][:-1] == [16] * (len(manifest["files"]) - 1)


def test_conversations_keep_truncated_rows_on_request_without_think_tags(finished_run,
                                                                          tmp_path):
    _, cfg, latest, _ = finished_run
    out = tmp_path / "conv"
    assert cli.main(["export", "--config", str(cfg), "--format", "conversations", "--out",
                     str(out), "--include-truncated"]) == 0
    records = [json.loads(line) for f in sorted(out.glob("part-*.jsonl"))
               for line in f.read_text().splitlines()]
    assert len(records) == len(latest)
    for r in records:
        *prompt, answer = r["conversations"]
        assert prompt == json.loads(latest.loc[r["id"], "messages"])
        assert answer["role"] == "assistant"
        assert answer["reasoning_content"] == latest.loc[r["id"], "reasoning"]
        for text in (answer["content"], answer["reasoning_content"]):
            assert "<think>" not in text and "</think>" not in text
    tools = {r["id"]: r["tools"] for r in records}
    assert json.loads(tools["tool-1"]) == TOOLS["tools"]
    assert all(t == "[]" for k, t in tools.items() if k != "tool-1")


@pytest.mark.parametrize("file_type", ["jsonl", "parquet"])
def test_messages_load_with_hf_datasets(finished_run, tmp_path, file_type):
    tree, cfg, latest, _ = finished_run
    out = tmp_path / "msgs"
    assert cli.main(["export", tree["job"]["output"] + "/" + tree["job"]["run_name"],
                     "--config", str(cfg), "--format", "messages", "--out", str(out),
                     "--file-type", file_type, "--rows-per-file", "10"]) == 0
    files = sorted(str(p) for p in out.glob(f"part-*.{file_type}"))
    assert len(files) > 1
    ds = datasets.load_dataset("json" if file_type == "jsonl" else "parquet",
                               data_files=files, split="train",
                               cache_dir=str(tmp_path / "hf-cache"))
    stop = latest[latest.finish_reason == "stop"]
    assert ds.num_rows == len(stop) and set(ds.column_names) == {"id", "messages", "tools"}
    first = ds[0]
    assert first["messages"][-1]["role"] == "assistant"
    assert first["messages"][-1]["reasoning_content"] == stop.loc[first["id"], "reasoning"]


def test_s3_errors_are_one_line(finished_run, capsys):
    _, cfg, _, _ = finished_run
    assert cli.main(["status", "s3://no-such-bucket-raygen/runs/x", "--config", str(cfg)]) == 1
    assert cli.main(["export", "--config", str(cfg), "--format", "messages", "--out",
                     "s3://no-such-bucket-raygen/out"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines)
    assert "no-such-bucket-raygen" in lines[1]


def test_trainable_yield_and_provenance_reach_the_manifest_and_report(finished_run, tmp_path,
                                                                        capsys):
    """--trainer-max-length on the real run: the manifest's yield equals the records'
    loss-mask tokens within N; its GPU clock is measured on the replicas; the run's
    provenance rides along; the report says the same per category."""
    from tests.integration.helpers import store_of
    tree, cfg, latest, _ = finished_run
    out = tmp_path / "yield"
    assert cli.main(["export", "--config", str(cfg), "--format", "pretokenized", "--out",
                     str(out), "--include-truncated", "--trainer-max-length", "2048"]) == 0
    assert "trainable at max length 2,048" in capsys.readouterr().out
    manifest = json.loads((out / "export.manifest").read_text())
    records = [json.loads(line) for f in sorted(out.glob("part-*.jsonl"))
               for line in f.read_text().splitlines()]
    ty = manifest["token_yield"]
    assert ty["overall"]["rows"] == len(records) == len(latest)
    assert ty["overall"]["trainable_tokens"] == sum(sum(r["loss_mask"][:2048]) for r in records)
    assert ty["overall"]["cut_tokens"] == sum(sum(r["loss_mask"][2048:]) for r in records) > 0
    # rows go out together, so several are in flight per replica (41 rows may all land
    # on one of the two replicas on a loaded machine)
    assert ty["gpu_clock"]["replicas"] in (1, 2), ty["gpu_clock"]
    assert ty["gpu_clock"]["mean_requests_in_flight"] > 1, ty["gpu_clock"]
    assert 0 < ty["overall"]["cut_gpu_hours"] < ty["overall"]["gpu_hours"]
    assert manifest["provenance"] == store_of(tree).read_json("provenance.json")
    assert manifest["provenance"]["engine"]["kind"] == "simulator"
    assert cli.main(["report", "--config", str(cfg), "--trainer-max-length", "2048"]) == 0
    report = store_of(tree).read_json("report.json")
    by_cat = report["token_yield"]["by_max_length"]["2048"]["by_category"]
    assert by_cat == {k: v for k, v in ty["by_category"].items()}
