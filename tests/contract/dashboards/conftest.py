"""promtool for the dashboards' contract tests."""

import shutil

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool. Fails (never skips): these checks are the point of the suite."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found on PATH. Install it with `apt-get install -y prometheus` "
            "(Debian; provides promtool) or via the project's setup target, then re-run.",
            pytrace=False,
        )
    return path
