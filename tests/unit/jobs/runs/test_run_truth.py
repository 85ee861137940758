"""What decides a run's status and what a run refuses: settings_hash coverage, the
legacy-hash refusal, completeness, a local output on a multi-node cluster."""

from __future__ import annotations

import pytest

from jobs.config import parse_config
from jobs.pipeline.settings import StageSettings
from jobs.runs.plans import check_settings
from jobs.runs.run import RunError, local_output_problem, verdict
from tests.support.held_index import holding

BASE = {"engine": {"kind": "simulator", "model_path": "sim-m", "context_length": 16384},
        "job": {"input": "p.jsonl", "output": "/tmp/o", "run_name": "r",
                "max_new_tokens": 4096}}


def _hash(**engine_or_job) -> str:
    tree = {"engine": dict(BASE["engine"]), "job": dict(BASE["job"])}
    for section, values in engine_or_job.items():
        tree[section].update(values)
    return StageSettings.of(parse_config(tree)).settings_hash


@pytest.mark.parametrize("change", [
    {"engine": {"chat_template": "model"}},
    {"engine": {"model_path": "sim-other"}},
    {"engine": {"served_model_name": "served"}},
    {"engine": {"think_end_token": "</reason>"}},
    {"job": {"context_policy": "clamp"}},
    {"job": {"sampling": {"temperature": 0.7}}},
])
def test_settings_hash_covers_every_output_setting(change):
    assert _hash(**change) != _hash()


def test_settings_hash_ignores_throughput_settings():
    assert _hash(engine={"max_running_requests": 64}) == _hash()
    assert _hash(job={"batch_size": 7, "max_actors": 4}) == _hash()


def test_rows_of_the_older_hash_are_refused_with_a_clear_message():
    stage = StageSettings.of(parse_config(BASE))
    index = holding({})
    index.first_budgets.update({(stage.legacy_settings_hash, 4096): 12})
    with pytest.raises(RunError, match="older raygen.*12 rows|12 rows from an older raygen"):
        check_settings(index, stage.settings_hash, 4096, "r", stage.legacy_settings_hash)
    same = holding({})
    same.first_budgets.update({(stage.settings_hash, 4096): 3})
    check_settings(same, stage.settings_hash, 4096, "r", stage.legacy_settings_hash)  # ok


def test_verdict_needs_every_prompt_answered_and_something_generated():
    snap = {"total": 10, "completed": 7, "failed": 2, "rejected": 1, "remaining": 0}
    assert verdict(snap, expect_all=True) == ("succeeded", None)
    status, error = verdict(dict(snap, completed=5, remaining=2), expect_all=True)
    assert status == "failed" and "2 of 10 prompts have no result" in error
    status, error = verdict(dict(snap, completed=0, failed=0, rejected=10), expect_all=True)
    assert status == "failed" and "nothing was generated" in error and "10 were rejected" in error


def test_local_output_on_a_multi_node_cluster_is_refused_unless_shared():
    assert local_output_problem(True, alive_nodes=1, shared=False) is None
    assert local_output_problem(False, alive_nodes=4, shared=False) is None
    assert local_output_problem(True, alive_nodes=4, shared=True) is None
    problem = local_output_problem(True, alive_nodes=4, shared=False)
    assert "4 nodes" in problem and "storage.shared_local_output" in problem


def test_a_run_of_a_newer_format_is_refused_before_anything_is_written(tmp_path):
    from jobs.pipeline.settings import RunMode
    from jobs.runs.run import run_job
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "q"}]}\n')
    run = tmp_path / "out" / "r"
    run.mkdir(parents=True)
    (run / "run.json").write_text('{"run_format": 4, "key_salt": ""}')
    cfg = parse_config({"job": {"input": str(prompts), "output": str(tmp_path / "out"),
                                "run_name": "r"}})
    with pytest.raises(RunError, match=r"run_format 4; this raygen reads 2, 3"):
        run_job(cfg, RunMode(), stop_exc=KeyboardInterrupt)
    written = {p.name for p in run.iterdir()} - {"run.json", ".lease.json.lock"}
    assert not written  # no lease left held, no inputs.json, no part
