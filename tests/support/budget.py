"""The suite's time budget: what `make test` may spend per tier and per module.

Figures are module sums (setup + call + teardown of every test of the module, as
`--durations=0` reports them) on this 2-core machine with nothing else running, in
seconds. Contract and integration run on two xdist workers side by side, so their wall
time is about half their sum. The budgets add up to `make test` <= 15 min from a fresh
clone (set-up ~1-2 min, unit ~1 min, contract + integration ~12 min: a sum of ~1,440 s).

tests/conftest.py adds each finished test's time to its module and prints, at the end
of a run, every tier against its budget and every module over its own (a report, not a
failure: CI machines run ~1.5-2x slower, and a loaded machine moves a module by a half).
A new module gets its entry here with its measured cost (tests/README.md, Time ledger);
tests/unit/test_budget.py checks that every contract and integration module has one.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping

TIERS = ("unit", "contract", "integration", "real engine")

# Per tier, in module-sum seconds.
TIER_BUDGET_S: dict[str, float] = {
    "unit": 60,
    "contract": 115,
    "integration": 1000,
    "real engine": 435,
}

# Per contract/integration module (the real-engine folder's pool start is charged to
# the module that runs first there: xdist_scopes hands the folder out as one scope).
# Each entry is the module's cost in the last ledger (tests/README.md) scaled down to its
# tier's budget (integration x0.80; contract and real engine fit theirs as measured):
# the share each module must reach for `make test` to fit 15 min. A module not in the ledger (under 2 s) has 1 s.
MODULE_BUDGET_S: dict[str, float] = {
    "tests/contract/cluster/test_cluster_auth.py": 1,
    "tests/contract/cluster/test_gpu_smoke.py": 3,
    "tests/contract/cluster/test_image_dependencies.py": 2,  # its resolver test runs beside (pypi)
    "tests/contract/cluster/test_image_tree.py": 10,
    "tests/contract/cluster/test_local_stack_stop.py": 1,
    "tests/contract/cluster/test_supply_chain.py": 2,
    "tests/contract/dashboards/test_catalog_imports.py": 1,
    "tests/contract/dashboards/test_cluster_monitoring_tools.py": 1,
    "tests/contract/dashboards/test_dashboard_promql.py": 1,
    "tests/contract/dashboards/test_local_prometheus.py": 2,
    "tests/contract/dashboards/test_provisioning_promql.py": 1,
    "tests/contract/dashboards/test_rules_promtool.py": 5,
    "tests/contract/jobs/io/test_s3_wire.py": 1,
    "tests/contract/jobs/pipeline/test_validate_processes.py": 1,
    "tests/contract/jobs/test_console_script.py": 1,
    "tests/contract/jobs/test_lazy_imports.py": 3,  # + raygen's parser in the probe (~1.5 CPU-s)
    "tests/contract/jobs/test_tune.py": 18,  # new: one simulator start, 3 points of 3 s
    "tests/contract/sglang/test_install.py": 1,
    "tests/contract/sglang/test_sglang_contract.py": 6,
    "tests/contract/sglang/test_sglang_differential.py": 18,
    "tests/contract/sglang/test_sglang_oracle.py": 2,
    "tests/contract/sglang/test_sglang_resolution.py": 1,
    "tests/contract/simulator/test_server_contract.py": 1,
    "tests/contract/simulator/test_server_runtime.py": 9,
    "tests/contract/test_bench_forecast.py": 4,
    "tests/contract/test_bench_key_digests.py": 1,
    "tests/contract/test_cpu_profile.py": 1,
    "tests/contract/test_unit_tier_on_a_fresh_machine.py": 8,
    "tests/integration/sglang/test_context_guard.py": 78,
    "tests/integration/sglang/test_differential.py": 2,
    "tests/integration/sglang/test_engine.py": 6,
    "tests/integration/sglang/test_every_turn.py": 9,
    "tests/integration/sglang/test_export_template.py": 3,
    "tests/integration/sglang/test_gpu_smoke_cpu.py": 70,  # 37 s idle + the small-pool engine
    "tests/integration/sglang/test_kv_pool.py": 25,  # on the small pool: no engine of its own
    "tests/integration/sglang/test_job.py": 31,  # +3: job.logprobs on the cut run, 3 one-shots
    "tests/integration/sglang/test_metrics_live.py": 43,
    "tests/integration/sglang/test_replica_loss.py": 80,
    "tests/integration/sglang/test_speculative.py": 50,
    "tests/integration/sglang/test_thinking_budget.py": 32,
    "tests/integration/test_admission_faults.py": 51,
    "tests/integration/test_bench_scale_smoke.py": 31,
    "tests/integration/test_bench_smoke.py": 40,
    "tests/integration/test_continuation.py": 20,
    "tests/integration/test_damaged_parts.py": 8,
    "tests/integration/test_dry_run.py": 9,
    "tests/integration/test_engine_ownership.py": 47,
    "tests/integration/test_engine_process.py": 20,  # +2 s: an engine exiting by itself
    "tests/integration/test_every_turn.py": 30,
    "tests/integration/test_exactly_once.py": 85,  # 106 s in 7f1c31f's idle run, x0.80
    "tests/integration/test_export.py": 15,
    "tests/integration/test_export_incremental.py": 9,
    "tests/integration/test_forecast_sim.py": 25,
    "tests/integration/test_full_disk.py": 12,
    "tests/integration/test_integrity.py": 69,  # + the drift trial with rows flowing (~+20 s)
    "tests/integration/test_job_e2e.py": 23,
    "tests/integration/test_job_submit.py": 88,
    "tests/integration/test_metrics_live.py": 76,
    "tests/integration/test_node_loss.py": 80,
    "tests/integration/test_operator_safety.py": 102,
    "tests/integration/test_run_index_resume.py": 22,
    "tests/integration/test_s3_throttling.py": 11,  # new: 14 s call alone (the 5 s moto teardown is the session's), x0.80
    "tests/integration/test_samples_per_prompt.py": 22,
    "tests/integration/test_serve_replica.py": 15,
    "tests/integration/test_stalls.py": 68,
    "tests/integration/test_upgrade.py": 13,
    "tests/integration/test_verified_writes.py": 4,
    "tests/integration/test_warmup.py": 4,
}

# A module is reported over budget only past this factor of its entry: a module's time
# moves by a third with the machine's load.
SLACK = 1.3


def tier_of(module: str) -> str:
    """``tests/integration/sglang/test_job.py`` -> "real engine"; tests/unit/... -> "unit"."""
    parts = module.split("/")
    if parts[:3] == ["tests", "integration", "sglang"]:
        return "real engine"
    return parts[1] if len(parts) > 1 and parts[0] == "tests" else "other"


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def tier_sums(times: Mapping[str, float]) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    for module, seconds in times.items():
        sums[tier_of(module)] += seconds
    return dict(sums)


def over_budget(times: Mapping[str, float], slack: float = SLACK) -> list[tuple[str, float, float]]:
    """(module, seconds, budget) of every module past ``slack`` x its budget, and of every
    contract/integration module with no budget at all (budget 0), the largest first."""
    out = []
    for module, seconds in times.items():
        if tier_of(module) == "unit":
            continue
        budget = MODULE_BUDGET_S.get(module, 0.0)
        if seconds > budget * slack:
            out.append((module, seconds, budget))
    return sorted(out, key=lambda item: -item[1])


def report(times: Mapping[str, float]) -> list[str]:
    """The lines `make test` ends with: each tier run against its budget, then the modules
    over theirs."""
    lines = []
    for tier, seconds in tier_sums(times).items():
        budget = TIER_BUDGET_S.get(tier)
        mark = "" if budget is None or seconds <= budget else "  OVER BUDGET"
        shown = "-" if budget is None else f"{budget:.0f}"
        lines.append(f"{tier}: {seconds:.0f} s of {shown} s{mark}")
    for module, seconds, budget in over_budget(times):
        why = "no budget entry" if not budget else f"budget {budget:.0f} s"
        lines.append(f"  {module}: {seconds:.0f} s ({why}; tests/support/budget.py)")
    return lines


class ModuleTimes:
    """Accumulates finished test phases by module (pytest's TestReport: nodeid, duration,
    and the CPU seconds tests/conftest.py measured over the test's process tree)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, duration: float, cpu_s: float = 0.0) -> None:
        self.times[module_of(nodeid)] += duration
        if cpu_s:
            self.cpu[module_of(nodeid)] += cpu_s

    def write(self, path: Path) -> None:
        """The module sums, and beside them (``<path>.cpu.json``) the module CPU seconds."""
        path.write_text(json.dumps(dict(sorted(self.times.items())), indent=1) + "\n")
        cpu_path(path).write_text(json.dumps(
            {m: round(s, 1) for m, s in sorted(self.cpu.items())}, indent=1) + "\n")


def cpu_path(times_path: Path) -> Path:
    return times_path.with_name(times_path.name + ".cpu.json")


def cpu_lines(cpu: Mapping[str, float], top: int = 15) -> list[str]:
    """The CPU the tiers and their costliest modules used (the suite is CPU-bound: its wall
    time is about this over the machine's 2 cores)."""
    lines = []
    for tier in TIERS:
        modules = {m: s for m, s in cpu.items() if tier_of(m) == tier}
        if modules:
            lines.append(f"{tier}: {sum(modules.values()):.0f} CPU-s")
    for module, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]:
        if tier_of(module) != "unit":
            lines.append(f"  {module}: {seconds:.0f} CPU-s")
    return lines


def load(paths: Iterable[Path]) -> dict[str, float]:
    """Module times merged from RAYGEN_TEST_TIMES files (one per pytest run)."""
    merged: dict[str, float] = defaultdict(float)
    for path in paths:
        for module, seconds in json.loads(Path(path).read_text()).items():
            merged[module] += seconds
    return dict(merged)
