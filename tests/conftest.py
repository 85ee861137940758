"""Session-wide test environment (dummy AWS credentials for the local S3 server), the
tier markers (every test is marked by its directory, so `-m unit`, `-m contract`,
`-m integration` (and `not ...`) select tiers without per-file marks), and the xdist
scopes `--dist loadscope` uses (tests/support/xdist_scopes.py)."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("AWS_ACCESS_KEY_ID", "raygen-test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "raygen-test")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "contract", "integration")


def pytest_itemcollected(item):
    """Mark each test with its tier: its first directory under tests/."""
    tier = item.path.resolve().relative_to(TESTS).parts[0]
    if tier in TIERS:
        item.add_marker(getattr(pytest.mark, tier))


def pytest_collection_modifyitems(config, items):
    """Longest scopes first (tests/support/xdist_scopes.py LONGEST_FIRST); a stable sort,
    so tests keep their order within a scope."""
    from tests.support.xdist_scopes import schedule_rank
    items.sort(key=lambda item: schedule_rank(item.nodeid))


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` with raygen's scopes: tests sharing an expensive fixture stay on
    one worker, every other test is scheduled on its own (tests/support/xdist_scopes.py)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    from tests.support.xdist_scopes import scope_of

    class FixtureScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return FixtureScopeScheduling(config, log)


# The time budget (tests/support/budget.py): every finished phase is added to its module
# on the process that reports (xdist's controller, or the single process), and the run
# ends with each tier against its budget and the modules over theirs.
_TIMES = None


def pytest_configure(config):
    global _TIMES
    if not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller
        from tests.support.budget import ModuleTimes
        _TIMES = ModuleTimes()


# Each test's CPU: its worker's process tree (the test process, its Ray cluster, S3 server,
# engines, drivers) from its setup to the end of its teardown (tests/support/tree_cpu.py),
# carried to the reporting process on the teardown report. Unit tests start no process:
# their wall time is their CPU, and the sampler is not started for them.
_TREE = None
_CPU_AT_SETUP: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    global _TREE
    if "unit" not in item.keywords:
        from tests.support.tree_cpu import TreeCpu
        _TREE = _TREE or TreeCpu()
        _CPU_AT_SETUP[item.nodeid] = _TREE.total_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and item.nodeid in _CPU_AT_SETUP:
        spent = _TREE.total_s() - _CPU_AT_SETUP.pop(item.nodeid)
        outcome.get_result().user_properties.append(("cpu_s", round(spent, 3)))


def pytest_runtest_logreport(report):
    if _TIMES is not None:
        _TIMES.add(report.nodeid, report.duration,
                   dict(report.user_properties).get("cpu_s", 0.0))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _TIMES is None or not _TIMES.times:
        return
    from tests.support.budget import cpu_lines, report
    terminalreporter.section("time budget (module sums, tests/support/budget.py)")
    for line in report(_TIMES.times):
        terminalreporter.write_line(line)
    if _TIMES.cpu:
        terminalreporter.section("CPU by module (each test's process tree, tests/support/tree_cpu.py)")
        for line in cpu_lines(_TIMES.cpu):
            terminalreporter.write_line(line)
    if os.environ.get("RAYGEN_TEST_TIMES"):
        _TIMES.write(Path(os.environ["RAYGEN_TEST_TIMES"]))
