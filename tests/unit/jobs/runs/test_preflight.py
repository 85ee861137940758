"""Before any engine is deployed: the reject guard (job.max_reject_fraction) stops a run
whose input is mostly bad, with the rejects written and progress.json failed; --dry-run
prints the plan and writes nothing (local runs here, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import yaml

from jobs import cli, generate
from jobs.pipeline.admission import Admission
from jobs.pipeline.admission_table import AdmissionTable
from jobs.config import parse_config
from jobs.runs.preflight import RejectTally, reason_kind, reject_problem
from jobs.pipeline.settings import RunMode
from jobs.runs.run import RunError, run_job

BAD = ['{"id": "b1", "messages": [', '{"id": "b2", "messages": []}', "not json at all",
       '{"id": "b3", "messages": [', '{"id": "p0", "messages": [{"role": "user", '
       '"content": "again"}]}']


def write_input(path: Path, good: int, bad: list[str]) -> Path:
    with open(path, "w") as f:
        for i in range(good):
            f.write(json.dumps({"id": f"p{i}", "messages": [
                {"role": "user", "content": f"question {i}"}]}) + "\n")
        for line in bad:
            f.write(line + "\n")
    return path


def tree_for(tmp_path: Path, good: int, bad: list[str], **job) -> dict:
    rows = write_input(tmp_path / "in.jsonl", good, bad)
    return {"job": {"input": str(rows), "output": str(tmp_path / "runs"), "run_name": "r1",
                    "progress_interval_s": 1, "metrics_linger_s": 0, **job}}


def _admission(total: int, rejects: int) -> Admission:
    empty = AdmissionTable(*(__import__("numpy").empty(0, t) for t in ("uint64", "int64")))
    return Admission(table=empty, total=total, valid_keys=total - rejects, rejects=rejects,
                     new_rejects=rejects, fingerprints=[])


def test_reasons_are_grouped_by_kind_without_row_specific_values():
    assert reason_kind("not valid JSON: Expecting value at column 1") == reason_kind(
        "not valid JSON: Expecting value at column 17")
    assert reason_kind("duplicate id 'p1': first seen at a.jsonl:3") == reason_kind(
        "duplicate id 'p22': first seen at b.jsonl:90") == "duplicate id"
    assert reason_kind("id 'x-1' starts with a reserved prefix") == reason_kind(
        "id 'abc' starts with a reserved prefix")
    assert reason_kind("missing 'messages'") == "missing 'messages'"  # field names stay


def test_the_tally_keeps_counts_and_the_first_place_of_each_kind():
    tally = RejectTally()
    tally.add([{"source": "a.jsonl", "line": 3, "reason": "'messages' is empty"},
               {"source": "a.jsonl", "line": 7, "reason": "not valid JSON: x at column 2"},
               {"source": "b.jsonl", "line": 1, "reason": "not valid JSON: x at column 9"}])
    assert tally.total == 3
    assert tally.top(1) == ("2 x not valid JSON: x at column N (e.g. a.jsonl:7); "
                            "1 more kinds")


@pytest.mark.parametrize("total,rejects,limit,stops", [
    (100, 5, 0.05, False),   # at the limit: goes on
    (100, 6, 0.05, True),
    (10, 9, 1.0, False),     # 1.0 disables the check
    (10, 10, 1.0, False),
    (10, 1, 0.0, True),      # 0: any reject stops the run
    (0, 0, 0.0, False),      # empty input: verdict() fails it later, not this check
])
def test_the_guard_compares_the_reject_share_with_the_limit(total, rejects, limit, stops):
    problem = reject_problem(_admission(total, rejects), limit, RejectTally())
    assert (problem is not None) == stops
    if stops:
        assert "job.max_reject_fraction" in problem and f"{rejects} of {total}" in problem


def test_max_reject_fraction_defaults_small_and_is_bounded():
    base = {"job": {"input": "a", "output": "o", "run_name": "r"}}
    assert parse_config(base).job.max_reject_fraction == 0.05
    with pytest.raises(Exception, match="max_reject_fraction"):
        parse_config({"job": dict(base["job"], max_reject_fraction=1.5)})


def test_a_mostly_bad_input_stops_before_ray_with_its_rejects_written(tmp_path, monkeypatch):
    import jobs.runs.run

    def deployed(*_):
        raise AssertionError("Ray was started for a run the guard must stop")
    monkeypatch.setattr(jobs.runs.run, "_init_ray", deployed)
    cfg = parse_config(tree_for(tmp_path, 3, BAD))
    with pytest.raises(RunError) as info:
        run_job(cfg, RunMode(), KeyboardInterrupt)
    message = str(info.value)
    assert message.startswith("5 of 8 input rows (62.5%) were rejected, more than "
                              "job.max_reject_fraction=0.05")
    # top reasons with counts and the first file:line of each
    assert f"3 x not valid JSON: Expecting value at column N (e.g. {cfg.job.input[0]}:4)" \
        in message
    assert f"1 x duplicate id (e.g. {cfg.job.input[0]}:8)" in message
    run = tmp_path / "runs" / "r1"
    from jobs.io.run_store import RunStore
    store = RunStore(str(run), cfg.storage)
    assert sorted(store.read_kind("rejects", ["line"]).column("line").to_pylist()) == [
        4, 5, 6, 7, 8]
    progress = json.loads((run / "progress.json").read_text())
    assert progress["status"] == "failed" and progress["rejected"] == 5
    assert not (run / "lease.json").exists() and store.part_paths("data") == []


def _cli(tmp_path: Path, tree: dict, capsys, *flags: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `raygen generate --config FILE --dry-run ...`; this
    tier's conftest fails the test if it calls ray.init (jobs.io.sources imports ray.data;
    importing starts nothing)."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tree))
    rc = cli.main(["generate", "--config", str(config), "--dry-run", *flags])
    out, err = capsys.readouterr()
    assert not ray.is_initialized()  # no cluster joined or started
    return rc, out, err


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    tree = tree_for(tmp_path, 40, BAD[:1], max_new_tokens=2048)
    rc, out, err = _cli(tmp_path, tree, capsys)
    assert rc == 0, err
    for line in ["dry run of run r1: nothing deployed, nothing written",
                 "input:     41 rows in 1 file(s), 40 distinct valid ids",
                 "rejects:   1 (1 not yet in rejects/): 1 x not valid JSON",
                 "guard:     2.4% rejected, limit job.max_reject_fraction=0.05: ok",
                 "done:      0 ids already in data/, 0 open failures",
                 "generate:  40 prompts now",
                 "budget:    job.max_new_tokens=2048, job.context_policy=reject, "
                 "engine.context_length=16384",
                 "replicas:  1..1 (serve.autoscaling min/max) of simulator engine "
                 "'sim-qwen', Serve app 'raygen'"]:
        assert line in out, out
    assert not (tmp_path / "runs").exists()  # no rejects, inputs.json, lease, progress


def test_dry_run_of_a_mostly_bad_input_says_the_run_would_stop(tmp_path, capsys):
    rc, _, err = _cli(tmp_path, tree_for(tmp_path, 3, BAD), capsys)
    assert rc == 1
    assert err.startswith("error: 5 of 8 input rows (62.5%) were rejected")
    assert "a run writes every rejected row with its reason to rejects/" in err
    assert "guard:     62.5% rejected, limit job.max_reject_fraction=0.05: WOULD STOP before " \
        "deploying" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flags", [["--continue-truncated", "--max-total-tokens", "9000"],
                                   ["--check-context"], ["--pilot", "5"]])
def test_dry_run_refuses_modes_it_cannot_plan(tmp_path, flags, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tree_for(tmp_path, 2, [])))
    assert generate.main(["--config", str(config), "--dry-run"] + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --dry-run cannot be combined with --") and \
        err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_after_the_guard_stopped_a_run_the_dry_run_names_the_written_rejects(tmp_path,
                                                                           monkeypatch, capsys):
    """A rerun's admission hands over only new rejects; the reasons of the ones already in
    rejects/ are read from there, so the message is the same the second time."""
    import jobs.runs.run
    monkeypatch.setattr(jobs.runs.run, "_init_ray", lambda *_: pytest.fail("Ray was started"))
    tree = tree_for(tmp_path, 3, BAD)
    with pytest.raises(RunError) as first:
        run_job(parse_config(tree), RunMode(), KeyboardInterrupt)
    rc, _, err = _cli(tmp_path, tree, capsys)
    assert rc == 1
    assert "rejects:   5 (0 not yet in rejects/): 3 x not valid JSON" in err
    assert err.startswith("error: " + str(first.value).split(". No engine")[0])
