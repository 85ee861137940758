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
from jobs.io.run_index import RunIndex
from jobs.runs.plans import input_locations
from tests.support.held_index import holding

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
    return plans.plan(cfg, store, inputs, RunIndex.open(store), mode,
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


def test_the_plans_and_the_run_module_import_at_the_top_only():
    # They used to hide ~25 imports in functions (run.py <-> plans.py went in a circle
    # through RunState): an import error then surfaced mid-session, after the lease.
    for module in ("jobs.runs.run", "jobs.runs.plans"):
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        hidden = [f"{module}:{node.lineno}" for fn in ast.walk(tree)
                  if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert not hidden, hidden
        assert "TYPE_CHECKING" not in (ROOT / (module.replace(".", "/") + ".py")).read_text()


def test_admission_and_the_plans_read_the_run_index_itself():
    # one resume state: no copy of the index's digests under another type
    import jobs.pipeline.admission as admission
    import jobs.runs.run as run
    assert not hasattr(admission, "PriorRun") and not hasattr(run, "RunState")
    index = holding({"a": None, "b": "sha256:x"}, failed=["a", "f"], reject_ids=["r"])
    assert len(index.done) == 2 and len(index.open_failed()) == 1  # "a" is done since
    assert index.reject_ids == {"r"}
