"""`raygen tune` on a real simulator process with a KV pool that binds: the sweep shows
retractions once more requests run than the pool holds, and the recommendation stays
below them; the configs it cannot tune are refused before anything starts."""

from __future__ import annotations

import json

import yaml

from jobs import cli

# ~30-token prompts at a 512-token budget; the simulator's lengths (median 1,820) cut
# nearly every row at the budget, so a running row ends near 540 tokens: a 4,096-token pool
# holds about 7 of them. 3 s points at time_scale 0.05: ~50 rows each. Conservativeness 0.3
# (new-token ratio 0.21 from the first step): at SGLang's default 1.0 the ratio starts at
# 0.7 and admits past the pool only as it decays over ~600 decode steps, so whether a 3 s
# point retracts hung on how the steps fell: an idle fresh-clone run saw 0 at both 16 and
# 32 (7.0 and 6.3 running), a run beside three CPU hogs 9 and 9. At 0.3: 2-5 at each, idle
# and beside the hogs, yet a fresh-clone run's window read 0 and 0 again (8.0 running):
# `raygen tune` now counts a point's retractions from the moment it raised the
# concurrency (jobs/tune/measure.py): 4-7 at 16 and 0-5 at 32 in three idle runs.
POOL = 4096


def config(tmp_path, **engine) -> str:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({
        "id": f"p{i}", "category": ["chat", "code"][i % 2],
        "messages": [{"role": "user", "content": f"Question {i}: explain step {i % 7} of "
                      f"problem {i * 7919 % 1000} in detail."}]}) + "\n" for i in range(64)))
    tree = {"engine": {"kind": "simulator", "model_path": "sim-tune", "max_running_requests": 32,
                       "context_length": 4096, "speculative": {"algorithm": "NEXTN"},
                       "start_timeout_s": 60,
                       "simulator": {"time_scale": 0.05, "max_total_tokens": POOL,
                                     "schedule_conservativeness": 0.3}, **engine},
            "serve": {"max_ongoing_requests": 64,
                      "autoscaling": {"min_replicas": 2, "max_replicas": 2}},
            "job": {"input": str(prompts), "output": str(tmp_path / "runs"), "run_name": "t",
                    "max_new_tokens": 512, "max_actors": 2, "inflight_rows_per_actor": 32}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def test_the_sweep_shows_retractions_above_the_pool_and_recommends_below_them(tmp_path, capsys):
    out = tmp_path / "tune.json"
    code = cli.main(["tune", "--config", config(tmp_path), "--concurrency", "4,16,32",
                     "--point-seconds", "3", "--sample", "32", "--json", str(out)])
    printed = capsys.readouterr()
    print(printed.out)
    assert code == 0, printed.err
    result = json.loads(out.read_text())
    low, mid, high = result["points"]
    assert [p["concurrency"] for p in result["points"]] == [4, 16, 32]
    assert low["retractions"] == 0 and low["output_tok_s"] > 0
    # 32 rows cannot fit 7 rows' pool: retractions above it, at 16 or 32 (a 3 s point is a
    # sample: loaded, 3 at 16 and 0 at 32), and 32 is not clean either way
    assert mid["retractions"] + high["retractions"] > 0 and not high["clean"]
    # The retractions prove the pool binds; the usage gauge is read at scrapes 1 s apart,
    # and the pool's peak lasts until its next retraction: one 3 s point sees 0.9+ idle,
    # 0.77 on a loaded fresh-clone run (it failed at > 0.8). Higher than at 4 rows anyway.
    assert high["token_usage_max"] > 0.6 and high["token_usage_max"] > low["token_usage"]
    assert all(2.0 <= p["accept_length"] <= 4.0 for p in result["points"])  # NEXTN at 3.0
    rec = result["recommended"]
    assert rec["point"]["clean"] and rec["point"]["retractions"] == 0
    assert rec["max_running_requests"] <= max(p["concurrency"] for p in result["points"]
                                              if p["clean"])
    assert rec["max_running_requests"] < 32
    # engine-hours: the simulator's replicas hold no GPU, each counts as one engine
    assert result["unit"] == "engine-h"
    hours = rec["point"]["gpu_hours_per_1b_output_tokens"]
    assert abs(hours - 1e9 / (rec["point"]["output_tok_s"] * 3600)) < 0.01 * hours
    assert result["engines"][0]["max_total_num_tokens"] == POOL
    assert f"--set engine.max_running_requests={rec['max_running_requests']}" in printed.out
    assert "<- recommended" in printed.out and "retracted at " in printed.out


def test_configs_it_cannot_tune_are_refused_before_anything_starts(tmp_path, capsys):
    path = config(tmp_path)
    assert cli.main(["tune", "--config", path, "--set", "engine.simulator.time_scale=0"]) == 2
    assert "cannot tune: engine.simulator.time_scale is 0" in capsys.readouterr().err
    assert cli.main(["tune", "--config", path, "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "--prompts" in capsys.readouterr().err
    cuda = tmp_path / "cuda.yaml"
    tree = yaml.safe_load(open(path))
    tree["engine"] = {"kind": "sglang", "model_path": "Qwen/Qwen3-8B", "device": "cuda"}
    tree["serve"]["max_ongoing_requests"] = 64
    cuda.write_text(yaml.safe_dump(tree))
    assert cli.main(["tune", "--config", str(cuda)]) == 2
    err = capsys.readouterr().err
    assert "cannot tune:" in err and ("no NVIDIA GPU" in err or "SGLang 0.5.23" in err), err
