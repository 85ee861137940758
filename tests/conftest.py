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
