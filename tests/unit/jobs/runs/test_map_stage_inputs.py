"""The map stages of continuation and --check-context check the columns they read once
per batch, as the chain's stages do (jobs/pipeline/stage_inputs.py)."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from jobs.config import StorageConfig
from jobs.io.run_index import row_ids
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA
from jobs.pipeline.stage_inputs import MissingColumn
from jobs.runs import continuation
from jobs.runs.context_check import CountTokens
from tests.support.run_rows import make_row


def test_the_continue_read_refuses_items_without_their_rows_and_reads_declared_ones(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    table = pa.Table.from_pylist([make_row("a"), make_row("b")], schema=DATA)
    path = store.loc("data", store.write_part("data", table, row_ids("data", table))).path
    with pytest.raises(MissingColumn, match=r"^continue: read rows: input batch has no "
                                            r"column 'rows' \(the positions"):
        continuation._read_rows(pa.table({"path": [path]}), store.uri, StorageConfig())
    items = pa.table({"path": [path], "rows": [[1]]})
    assert list(continuation.READ_INPUTS.columns) == items.column_names
    read = continuation._read_rows(items, store.uri, StorageConfig())
    assert read.column("key").to_pylist() == ["b"]


def test_token_counting_refuses_a_batch_without_the_tools_column():
    class Counts:
        def remote(self, prompts):
            async def answer():
                return [len(p["messages"]) for p in prompts]
            return answer()

    counter = CountTokens.__new__(CountTokens)  # its __init__ looks up a real Serve handle
    counter.handle = type("Handle", (), {"count_prompt_tokens": Counts()})()
    batch = pa.table({"key": ["a"], "messages": ['[{"role": "user", "content": "hi"}]']})
    with pytest.raises(MissingColumn, match=r"^count tokens: .*'tools'"):
        asyncio.run(counter(batch))
    out = asyncio.run(counter(batch.append_column("tools", pa.array([None], pa.string()))))
    assert out.to_pylist() == [{"key": "a", "prompt_tokens": 1}]
