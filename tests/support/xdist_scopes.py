"""Which tests must share an xdist worker: `make test` runs contract + integration as
`pytest -n 2 --dist loadscope`, and tests/conftest.py makes that scheduler use
``scope_of`` instead of "one scope per module".

A scope runs on one worker, so a fixture its tests share starts once: every contract
folder and integration subfolder (its session fixtures: SGLang's stack, the simulators,
the pool of real SGLang engines in tests/integration/sglang/) and each integration
module listed below (one module fixture: a run, an engine, a Prometheus). Every other
test is its own scope, so the long fault tests spread over both workers.

(pytest-xdist's own ``xdist_group`` mark does not work here: xdist 3.8 renames the item
through ``item._nodeid``, which pytest 9.2 no longer reads; the groups are silently
ignored.)
"""

from __future__ import annotations

# Integration modules whose tests share a module-scoped fixture (a unit test checks that
# every such module is listed).
MODULE_FIXTURE_MODULES = frozenset({
    "tests/integration/test_engine_process.py",
    "tests/integration/test_export.py",
    "tests/integration/test_job_e2e.py",
    "tests/integration/test_job_submit.py",
    "tests/integration/test_metrics_live.py",
})


def scope_of(nodeid: str) -> str:
    """The xdist scope of a test id such as ``tests/contract/sglang/test_x.py::test_y``."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if parts[:2] in (["tests", "contract"], ["tests", "integration"]) and len(parts) > 3:
        return "/".join(parts[:3])  # a folder: its session fixtures (SGLang's pool) start once
    if path in MODULE_FIXTURE_MODULES:
        return path
    return nodeid


# The longest scopes first (their share of `make test`, tests/README.md's ledger), so the
# two workers start on them and finish together: xdist hands out scopes in collection
# order, and a 5-minute scope collected last leaves one worker idle for its whole length.
LONGEST_FIRST = (
    "tests/integration/sglang/",           # the pool of real SGLang engines
    "tests/integration/test_metrics_live.py",
    "tests/integration/test_node_loss.py",
    "tests/integration/test_stalls.py",
    "tests/integration/test_exactly_once.py",
    "tests/integration/test_operator_safety.py",
    "tests/integration/test_engine_ownership.py",
    "tests/integration/test_admission_faults.py",
    "tests/integration/test_export.py",
)


def schedule_rank(nodeid: str) -> int:
    """Sort key of a test: its scope's place in LONGEST_FIRST (the rest after, as collected)."""
    for rank, prefix in enumerate(LONGEST_FIRST):
        if nodeid.startswith(prefix):
            return rank
    return len(LONGEST_FIRST)
