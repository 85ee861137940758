"""job.regenerate every_turn on the simulator engines (real Ray, moto S3): multi-turn and
tool-call conversations (jobs/demo_prompts.py's multi_turn and tool_calling, and
three-turn chats) regenerated turn by turn; the driver is SIGKILLed once a later round
is writing and the command rerun. Then every conversation holds one row per round
(versions 0..k, none twice), each turn generated once (a version's earlier turns are the
previous version's), each prompt rendered on the model's own earlier turns, each stop
recorded and right (complete / length / tool_calls_differ), and the pretokenized export
masks every assistant turn."""

from __future__ import annotations

import json
import random
import signal
import subprocess

import pytest

from jobs import cli, demo_prompts
from jobs.pipeline import turns
from serve_apps.chat_format import IM_END, render_prompt
from serve_apps.engines.simulator import tokenizer as tk
from tests.integration.helpers import generate_cmd, generate_main, read, run_config, store_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _prompts(path) -> dict[str, dict]:
    rng, rows = random.Random(7), {}
    for i in range(6):
        rows[f"multi-{i}"] = demo_prompts.multi_turn(rng, i)
        rows[f"tool-{i}"] = demo_prompts.tool_calling(rng, i)  # odd: one turn; even: a call
        rows[f"three-{i}"] = {"messages": [
            {"role": "user", "content": f"Name a prime above {10 * i}."},
            {"role": "assistant", "content": "Here is one."},
            {"role": "user", "content": "Why is it prime?"},
            {"role": "assistant", "content": "It has no divisors."},
            {"role": "user", "content": "Now one above it."}]}
    with open(path, "w") as f:
        for key, row in rows.items():
            f.write(json.dumps({"id": key, "category": key.split("-")[0], **row}) + "\n")
    return rows


def _check_rows(data, sources: dict[str, dict]) -> None:
    assert not data.duplicated(["key", "version"]).any()
    for key, group in data.groupby("key"):
        group = group.sort_values("version")
        first = group.iloc[0]  # the source as validated (canonical messages)
        source = json.loads(first["messages"])
        tools = json.loads(first["tools"]) if isinstance(first["tools"], str) else None
        assert list(group["version"]) == list(range(len(group))), key  # one row per round
        last = None
        for _, row in group.iterrows():
            done = list(row["turns"])
            if str(row["turn_stop"]).startswith(turns.ERROR):  # e.g. the grown history
                assert [list(t["output_token_ids"]) for t in done] == [  # overflows the
                    list(t["output_token_ids"]) for t in last]  # context: turns kept
                break
            assert len(done) == row["version"] + 1
            if last is not None:  # earlier turns kept as generated: each turn made once
                assert [list(t["output_token_ids"]) for t in done[:-1]] == [
                    list(t["output_token_ids"]) for t in last]
                assert last[-1]["finish_reason"] != "length"
            # the prompt is rendered on the model's own earlier turns
            messages = turns.prompt_messages(source, done[:-1])
            assert list(row["prompt_token_ids"]) == tk.encode(render_prompt(messages, tools))
            assert list(row["output_token_ids"]) == list(done[-1]["output_token_ids"])
            last = done
        stop, final = group.iloc[-1]["turn_stop"], last[-1]
        assert group.iloc[:-1]["turn_stop"].isna().all()
        if stop.startswith(turns.ERROR):
            assert stop == "error:context_overflow", stop
        elif stop == turns.COMPLETE:
            assert len(last) == turns.turn_count(source)
        elif stop == turns.LENGTH:
            assert final["finish_reason"] == "length"
        else:  # the simulator calls no tools: a source turn that did stops its conversation
            assert stop == turns.TOOL_CALLS_DIFFER, stop
            assert source[turns.assistant_positions(source)[len(last) - 1]].get("tool_calls")


@pytest.mark.slow
def test_every_turn_killed_mid_round_resumes_exactly_and_exports_every_turn(
        ray_cluster, s3_endpoint, tmp_path, capsys):
    sources = _prompts(tmp_path / "p.jsonl")
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(tmp_path / "p.jsonl"),
                      job={"regenerate": "every_turn", "max_new_tokens": 8192,
                           "rows_per_file": 2, "batch_size": 2,
                           "inflight_rows_per_actor": 4})
    store = store_of(tree)
    cmd = generate_cmd(tmp_path / "every.yaml", tree)
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def later_rounds() -> int:
        try:
            return int((read(tree, "data")["version"] > 0).sum())
        except Exception:  # noqa: BLE001 - no part yet
            return 0
    wait_until(lambda: later_rounds() > 0 or first.poll() is not None, 240, "round 2 rows")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, "the kill should land in a later round"
    killed_with = read(tree, "data")
    # The resume in this process: only the killed driver needs one of its own.
    capsys.readouterr()
    assert generate_main(cmd[3:]) == 0
    resumed = capsys.readouterr().out
    assert "next turn: " in resumed and "every turn: conversations " in resumed
    said = (f"killed with {len(killed_with)} rows durable, "
            f"{int((killed_with['version'] > 0).sum())} of later rounds; resumed:\n"
            f"{resumed}")

    data = read(tree, "data")
    assert read(tree, "failures").empty
    _check_rows(data, sources)
    latest = data.sort_values("version").drop_duplicates("key", keep="last").set_index("key")
    assert set(latest.index) == set(sources) and latest["turn_stop"].notna().all()
    stops = latest["turn_stop"].value_counts().to_dict()
    assert stops.get(turns.COMPLETE) and stops.get(turns.TOOL_CALLS_DIFFER), stops
    assert (latest["version"] == 2).any()  # three-turn chats went three rounds
    # rows durable at the kill were not redone: each (key, version) is the one written then
    kept = data.merge(killed_with[["key", "version", "created_at"]], on=["key", "version"])
    assert (kept["created_at_x"] == kept["created_at_y"]).all() and len(kept) == len(
        killed_with)
    progress = store.read_json("progress.json")
    assert (progress["total"], progress["completed"]) == (len(sources),) * 2

    # the pretokenized export masks every assistant turn: earlier ones in the prompt
    out = tmp_path / "pretok"
    assert cli.main(["export", str(store.uri), "--config", str(tmp_path / "every.yaml"),
                     "--format", "pretokenized", "--out", str(out),
                     "--include-truncated"]) == 0
    capsys.readouterr()
    print(said, "stops:", stops)  # for the record
    records = {r["id"]: r for f in sorted(out.glob("part-*.jsonl"))
               for r in map(json.loads, f.read_text().splitlines())}
    assert set(records) == set(latest.index)
    for key, r in records.items():
        row, done = latest.loc[key], list(latest.loc[key, "turns"])
        ids, mask = r["input_ids"], r["loss_mask"]
        assert ids == list(row["prompt_token_ids"]) + list(row["output_token_ids"])
        spans, at = [], None
        for i, bit in enumerate(mask + [0]):
            if bit and at is None:
                at = i
            elif not bit and at is not None:
                spans.append(ids[at:i])
                at = None
        assert len(spans) == len(done)  # one masked span per assistant turn
        assert spans[-1] == list(row["output_token_ids"])
        for span, turn in zip(spans[:-1], done[:-1]):  # the turn as the template renders it
            assert tk.decode(span, skip_special_tokens=False) == turn["answer"] + IM_END
