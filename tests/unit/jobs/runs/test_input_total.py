"""jobs.runs.plans.input_total: the input's row count is taken once (admission records it
in inputs.json) and reused while the file keeps its size."""

from __future__ import annotations

import pytest

from jobs.config import StorageConfig
from jobs.io import sources
from jobs.io.run_store import RunStore
from jobs.io.storage import locate, write_json_atomic
from jobs.runs.plans import input_total


@pytest.fixture
def setup(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    path.write_text("".join('{"messages": []}\n' for _ in range(5)))
    loc = locate(str(path), StorageConfig())
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    counted = []
    real = sources.count_rows
    monkeypatch.setattr(sources, "count_rows", lambda l: counted.append(l.uri) or real(l))
    return store, loc, path, counted


def record(store, loc, rows, size, sha="x"):
    write_json_atomic(store.loc("inputs.json"), {"files": [
        {"uri": loc.uri, "rows": rows, "size": size, "sha256": sha}]})


def test_recorded_count_is_reused_without_reading_the_input(setup):
    store, loc, path, counted = setup
    record(store, loc, 1000, path.stat().st_size)  # deliberately not the real count
    assert input_total(store, [loc], None) == 1000 and counted == []
    assert input_total(store, [loc], 10) == 10 and counted == []


def test_an_input_of_another_size_or_counted_only_to_a_smaller_limit_is_counted(setup):
    store, loc, path, counted = setup
    record(store, loc, 1000, path.stat().st_size + 1)
    assert input_total(store, [loc], None) == 5 and counted == [loc.uri]
    record(store, loc, 2, path.stat().st_size, sha=None)  # an earlier run's limit of 2
    assert input_total(store, [loc], 2) == 2 and len(counted) == 1
    assert input_total(store, [loc], None) == 5 and len(counted) == 2


def test_no_inputs_json_counts(setup):
    store, loc, _, counted = setup
    assert input_total(store, [loc], None) == 5 and counted == [loc.uri]
