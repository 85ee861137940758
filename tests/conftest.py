"""Session-wide test environment (dummy AWS credentials for the local S3 server) and the
tier markers: every test is marked by its directory, so `-m unit`, `-m contract`,
`-m integration` (and `not ...`) select tiers without per-file marks."""

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
