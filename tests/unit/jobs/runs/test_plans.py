"""jobs.runs.plans: one plan per run mode, decided on the driver before Ray (local run
prefixes here); the run modules no longer import each other."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from jobs.config import parse_config
from jobs.io.run_store import RunStore
from jobs.pipeline.settings import RunMode, StageSettings
from jobs.runs import plans
from jobs.runs.errors import RunError
from jobs.runs.run import RunState, input_locations

ROOT = Path(__file__).resolve().parents[4]


def _setup(tmp_path: Path, n: int = 3):
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"id": f"p{i}", "messages": [
        {"role": "user", "content": f"q {i}"}]}) + "\n" for i in range(n)) + "not json\n")
    cfg = parse_config({"engine": {"kind": "simulator", "model_path": "sim-m",
                                   "context_length": 16384},
                        "job": {"input": str(rows), "output": str(tmp_path / "runs"),
                                "run_name": "r", "max_reject_fraction": 0.9}})
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    return cfg, store, input_locations(cfg)


def _plan(cfg, store, inputs, mode: RunMode) -> plans.Plan:
    return plans.plan(cfg, store, inputs, RunState.read(store), mode,
                      StageSettings.of(cfg, mode))


def test_a_fresh_plan_admits_every_input_row_and_expects_a_result_for_each(tmp_path):
    cfg, store, inputs = _setup(tmp_path)
    plan = _plan(cfg, store, inputs, RunMode())
    assert (plan.total, plan.expect_all) == (4, True)  # 3 valid + 1 reject, all answered
    assert store.read_json("inputs.json")["files"]  # the admission pass ran


@pytest.mark.parametrize("total, message", [
    (None, "needs --max-total-tokens N"),
    (16384, "cannot fit engine.context_length 16384"),
])
def test_a_continue_plan_refuses_a_missing_or_impossible_total(tmp_path, total, message):
    cfg, store, inputs = _setup(tmp_path)
    with pytest.raises(RunError, match=message):
        _plan(cfg, store, inputs, RunMode.of_flags(continue_truncated=True,
                                                   max_total_tokens=total))


def test_a_continue_plan_with_nothing_truncated_expects_nothing_and_admits_nothing(tmp_path):
    cfg, store, inputs = _setup(tmp_path)
    plan = _plan(cfg, store, inputs, RunMode.of_flags(continue_truncated=True,
                                                      max_total_tokens=8192))
    assert (plan.total, plan.expect_all) == (4, False)
    assert store.read_json("inputs.json") is None  # no admission pass for a continue run


def _runtime_imports(module: str) -> set[str]:
    """Modules (and names) a module imports at run time (type-only imports left out)."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in type_only:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_continuation_and_the_plans_do_not_import_the_run_module():
    # continuation used to import jobs.runs.run (RunError) while run imported continuation
    for module in ("jobs.runs.continuation", "jobs.runs.plans"):
        assert not {"jobs.runs.run", "jobs.runs.run.RunError"} & _runtime_imports(module), module
