"""Each Ray Data stage of the chain names the columns it reads and checks them once per
batch: a batch without one fails with one line naming the stage and the column; a batch
holding exactly the declared columns is enough (the declaration is complete)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from jobs.config import StorageConfig
from jobs.io.digests import key_digest
from jobs.io.run_store import RunStore
from jobs.io.samples import sample_digests
from jobs.io.schema import DATA
from jobs.io.sources import RAW_SCHEMA, ordinal_of
from jobs.pipeline.admission_table import AdmissionTable
from jobs.pipeline.admit_stage import ADMIT_INPUTS, admit_batch
from jobs.pipeline.sink import RunSink
from jobs.pipeline.stage_inputs import MissingColumn, StageInputs
from jobs.pipeline.validate import VALIDATE_INPUTS, validate_batch
from tests.support.run_rows import make_row

LINE = json.dumps({"id": "k", "messages": [{"role": "user", "content": "hi"}]})


def raw_batch() -> pa.Table:
    return pa.table({"source": ["a.jsonl"], "line": [1], "ordinal": [ordinal_of(0, 1)],
                     "raw": [LINE], "problem": [None]}, schema=RAW_SCHEMA)


def one_line_error(call, *names: str) -> str:
    with pytest.raises(MissingColumn) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for name in names:
        assert repr(name) in message, message
    return message


def test_the_error_names_the_stage_every_missing_column_and_what_the_batch_has():
    inputs = StageInputs("demo", {"a": "the first", "b": "the second", "c": "the third"})
    batch = pa.table({"b": [1], "z": [2]})
    message = one_line_error(lambda: inputs.check(batch), "a", "c")
    assert message == ("demo: input batch has no column 'a' (the first); 'c' (the third); "
                       "it has b, z")
    assert inputs.missing(batch) == ["a", "c"]
    inputs.check(pa.table({"a": [1], "b": [1], "c": [1], "extra": [0]}))  # extras are fine


def test_a_batch_of_no_rows_reads_nothing_and_passes():
    VALIDATE_INPUTS.check(pa.table({"other": pa.array([], pa.string())}))


@pytest.mark.parametrize("column", RAW_SCHEMA.names)
def test_validate_refuses_a_batch_without_a_column_it_reads(column):
    batch = raw_batch().drop_columns([column])
    message = one_line_error(lambda: validate_batch(batch), column)
    assert message.startswith("validate: ")


def test_validate_needs_nothing_but_the_reads_columns():
    assert list(VALIDATE_INPUTS.columns) == RAW_SCHEMA.names
    assert validate_batch(raw_batch()).column("key").to_pylist() == ["k"]


def test_admit_refuses_a_batch_without_a_column_it_reads():
    table = AdmissionTable(np.array([key_digest("k")], np.uint64), np.array([1], np.int64))
    batch = validate_batch(raw_batch()).drop_columns(["reject_reason"])
    message = one_line_error(lambda: admit_batch(batch, table), "reject_reason")
    assert message.startswith("admit: ")


@pytest.mark.parametrize("samples", [1, 3])
def test_admit_needs_nothing_but_its_declared_columns(samples):
    validated = validate_batch(raw_batch())
    batch = validated.select(list(ADMIT_INPUTS.columns))
    ordinal = validated.column("ordinal").to_numpy()
    if samples == 1:
        table = AdmissionTable(np.array([key_digest("k")], np.uint64), ordinal)
    else:
        ids = np.sort(sample_digests(np.array([key_digest("k")], np.uint64), 2))
        table = AdmissionTable(ids, ordinal, samples=samples)
    out = admit_batch(batch, table)
    assert out.num_rows == 1 and out.column("key").to_pylist() == ["k"]
    if samples > 1:
        assert out.column("sample").to_pylist() == [2]


def test_the_writer_refuses_rows_without_their_destination_or_a_column_of_it(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    sink = RunSink(store.uri, StorageConfig(), rows_per_file=4)
    rows = pa.Table.from_pylist([make_row("k0")], schema=DATA)
    message = one_line_error(lambda: sink.write([rows], ctx=None), "_kind")
    assert message.startswith("write: ")
    kinded = rows.append_column("_kind", pa.array(["data"]))
    message = one_line_error(lambda: sink.write([kinded.drop_columns(["version"])], ctx=None),
                             "version")
    assert message.startswith("write data/: ")
    assert store.part_paths("data") == []  # refused before anything was written
    assert sink.write([kinded], ctx=None) == {"data": 1, "failures": 0}
