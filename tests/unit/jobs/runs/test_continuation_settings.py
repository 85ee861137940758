"""--continue-truncated checks the rows' settings and records its own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jobs.io.digests import key_digest
from jobs.io.run_index import RunIndex
from contract.protocol import GenerateResult
from jobs.config import StorageConfig, parse_config
from jobs.io.run_store import RunStore
from jobs.runs.continuation import to_continue
from jobs.pipeline.rows import continued_row
from jobs.pipeline.settings import StageSettings
from jobs.runs.run import RunError
from tests.support.run_rows import make_row, write_rows

TREE = {"engine": {"kind": "simulator", "model_path": "sim-m"},
        "job": {"input": "p.jsonl", "output": "/tmp/o", "run_name": "r"}}


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(str(tmp_path / "run"), StorageConfig())


def test_rows_made_under_other_settings_are_not_continued(store):
    write_rows(store, "data", [make_row("a", finish_reason="length", settings_hash="old"),
                               make_row("b", finish_reason="length", settings_hash="new"),
                               make_row("c", finish_reason="stop", settings_hash="old")])
    with pytest.raises(RunError, match=r"1 truncated rows were generated with other "
                                       r"settings \(old \(1 rows\)\) than this config \(new"):
        to_continue(RunIndex.open(store), 8192, "new")


def test_rows_under_these_settings_are_chosen(store):
    write_rows(store, "data", [make_row("a", finish_reason="length", settings_hash="new"),
                               make_row("b", finish_reason="stop", settings_hash="old")])
    assert to_continue(RunIndex.open(store), 8192, "new").tolist() == [key_digest("a")]


def test_continued_row_records_the_continuation_settings():
    base = make_row("a", finish_reason="length", settings_hash="h", sampling="{}", model="m")
    result = GenerateResult(key="a", reasoning="r", answer="a", finished_thinking=True,
                            output_token_ids=[1], finish_reason="stop", cached_tokens=0,
                            budget_clamped_by="", replica="x", completion_tokens=10,
                            reasoning_tokens=0, effective_max_new_tokens=10, latency_s=1.0)
    stage = replace(StageSettings.of(parse_config(TREE)), continue_to=8192,
                    settings_hash="h2", sampling_json='{"t": 1}', model="m2")
    row = continued_row(base, result, stage, attempts=1)
    assert (row["settings_hash"], row["sampling"], row["model"]) == ("h2", '{"t": 1}', "m2")
