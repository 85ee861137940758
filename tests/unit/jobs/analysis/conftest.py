"""A run store on the local filesystem for the reporting tests."""

import pytest

from jobs.config import StorageConfig
from jobs.io.run_store import RunStore


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(str(tmp_path / "run"), StorageConfig())
