"""jobs.pipeline.generate_stage: a result is routed by its error class (contract.outcomes)
and the stage settings decide fresh vs continue; the replica is an in-process fake."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pyarrow as pa
import pytest

from contract.protocol import GenerateResult
from jobs.config import parse_config
from jobs.pipeline.generate_stage import GenerateRows, stage_inputs
from jobs.pipeline.retry import Breaker, CircuitOpen, ForeignEngine, SystematicErrors
from jobs.pipeline.row_sender import RowSender
from jobs.pipeline.settings import RunMode, StageSettings
from jobs.pipeline.stage_inputs import MissingColumn
from serve_apps.app import deployed_engine_hash

TREE = {"engine": {"kind": "simulator", "model_path": "sim-m"},
        "job": {"input": "p.jsonl", "output": "/tmp/o", "run_name": "r", "max_new_tokens": 64,
                "retries": {"max_attempts": 3, "backoff_initial_s": 0, "backoff_max_s": 0}}}


class FakeReplica:
    """Answers every request with ``answer(request)``; records what it was sent."""

    def __init__(self, answer, engine_hash: str = ""):
        # Like a real replica, every result carries its engine's hash: this run's by default.
        self.answer, self.sent = answer, []
        self.engine_hash = engine_hash or deployed_engine_hash(parse_config(TREE).engine)

    def options(self, stream):
        return self

    @property
    def generate_many(self):
        return self

    def remote(self, requests):
        self.sent.extend(requests)
        return self._stream(requests)

    async def _stream(self, requests):
        for r in requests:
            result = self.answer(r)
            result.engine_config_hash = self.engine_hash
            yield result


class RecordedIntegrity:
    """IntegrityCounters' interface, keeping what it was told."""

    def __init__(self):
        self.records = []

    def record(self, replica, flags):
        self.records.append((replica, list(flags)))


def _stage(mode: RunMode = RunMode()) -> StageSettings:
    return StageSettings.of(parse_config(TREE), mode)


def _rows(handle, stage: StageSettings, window: int = 10, min_rows: int = 10) -> GenerateRows:
    rows = GenerateRows.__new__(GenerateRows)  # its __init__ looks up a real Serve handle
    rows.stage, rows.retries, rows.category_label = stage, stage.retries, str
    rows.integrity = RecordedIntegrity()
    rows.sender = RowSender(handle, inflight_rows=4, rows_per_call=4, linger_s=0.01)
    rows.breaker = Breaker(window_rows=window, min_rows=min_rows, max_failure_fraction=0.5,
                           max_same_error_fraction=0.8)
    return rows


def _row(key: str) -> dict:
    return {"key": key, "id": key, "category": "c", "source": "p.jsonl", "line": 1,
            "messages": '[{"role": "user", "content": "hi"}]', "tools": None}


def _run(gen: GenerateRows, rows: list[dict]) -> list[dict]:
    async def go():
        return [await gen._one(r) for r in rows]
    return asyncio.run(go())


def _failed(error_class):
    return lambda r: GenerateResult.failed(r.key, error_class, "boom", replica="r0")


def test_an_unknown_error_class_is_not_retried_and_keeps_its_name_in_failures():
    handle = FakeReplica(_failed("made_up"))
    (out,) = _run(_rows(handle, _stage()), [_row("a")])
    assert len(handle.sent) == 1
    assert (out["_kind"], out["error_class"], out["retryable"]) == ("failures", "made_up", False)


def test_a_flood_of_unknown_errors_stops_the_job_as_systematic():
    gen = _rows(FakeReplica(_failed("made_up")), _stage(), window=5, min_rows=5)
    with pytest.raises(SystematicErrors, match="'made_up'.*failures/"):
        _run(gen, [_row(f"k{i}") for i in range(5)])


def test_a_transient_class_is_retried_then_counts_as_an_engine_failure():
    handle = FakeReplica(_failed("engine_5xx"))
    gen = _rows(handle, _stage(), window=4, min_rows=4)
    outs: list[dict] = []

    async def go():
        for i in range(4):
            outs.append(await gen._one(_row(f"k{i}")))
    with pytest.raises(CircuitOpen):  # the 4th engine failure fills the window
        asyncio.run(go())
    assert len(handle.sent) == 12  # job.retries.max_attempts each
    assert outs[0]["retry_classes"] == ["engine_5xx", "engine_5xx"]
    assert outs[0]["retryable"] is True and len(outs) == 3


def test_context_overflow_is_the_rows_own_fault_and_never_trips_the_breaker():
    gen = _rows(FakeReplica(_failed("context_overflow")), _stage(), window=5, min_rows=5)
    outs = _run(gen, [_row(f"k{i}") for i in range(8)])
    assert {o["error_class"] for o in outs} == {"context_overflow"}


def _ok(r):
    return GenerateResult(key=r.key, text="x", reasoning="", answer="x", finished_thinking=True,
                          prompt_token_ids=[1], output_token_ids=[2], finish_reason="stop",
                          prompt_tokens=1, completion_tokens=1, reasoning_tokens=0,
                          max_new_tokens=r.max_new_tokens,
                          effective_max_new_tokens=r.max_new_tokens, latency_s=0.1,
                          budget_clamped_by="", replica="r9")


def test_a_row_from_another_engine_stops_the_run_and_is_not_returned():
    stage = _stage()
    assert stage.engine_config_hash == deployed_engine_hash(parse_config(TREE).engine)
    (mine,) = _run(_rows(FakeReplica(_ok), stage), [_row("a")])
    assert mine["_kind"] == "data"
    with pytest.raises(ForeignEngine) as info:
        _run(_rows(FakeReplica(_ok, engine_hash="0123456789abcdef"), stage), [_row("b")])
    assert isinstance(info.value, CircuitOpen)  # the job's breaker path: the run stops
    message = str(info.value)
    assert "replica r9 of Serve app 'raygen' answered with engine 0123456789abcdef" in message
    assert stage.engine_config_hash in message and "rerun the same command" in message


def test_each_data_row_is_counted_for_its_replica_with_its_flags():
    def looping(r):
        result = _ok(r)
        result.output_token_ids = [0] * 100
        return result
    gen = _rows(FakeReplica(looping), _stage())
    (out,) = _run(gen, [_row("a")])
    assert out["integrity_flags"] == ["token_run"]
    assert gen.integrity.records == [("r9", ["token_run"])]
    gen = _rows(FakeReplica(_failed("made_up")), _stage())
    _run(gen, [_row("b")])
    assert gen.integrity.records == []  # a failure row is not a data row


def test_a_replica_that_reports_no_engine_is_foreign_too():
    with pytest.raises(ForeignEngine, match=r"\(none reported\)"):
        _run(_rows(_NoHash(_ok), _stage()), [_row("a")])


class _NoHash(FakeReplica):
    """An older replica: its results carry no engine hash."""

    async def _stream(self, requests):
        for r in requests:
            yield self.answer(r)


def test_a_continue_run_sends_ids_with_the_rest_of_the_budget_and_writes_the_next_version():
    def answer(r):
        return GenerateResult(key=r.key, text="more", reasoning="", answer="more",
                              finished_thinking=True, prompt_token_ids=r.input_ids[:r.prompt_len],
                              output_token_ids=r.input_ids[r.prompt_len:] + [9],
                              finish_reason="stop", prompt_tokens=r.prompt_len,
                              completion_tokens=1, reasoning_tokens=0,
                              max_new_tokens=r.max_new_tokens,
                              effective_max_new_tokens=r.max_new_tokens, latency_s=1.0,
                              budget_clamped_by="", replica="r0")
    handle = FakeReplica(answer)
    stage = _stage(RunMode.of_flags(continue_truncated=True, max_total_tokens=100))
    base = dict(_row("a"), version=0, prompt_token_ids=[1, 2], output_token_ids=[5, 6, 7],
                completion_tokens=3, reasoning_tokens=0, finished_thinking=True,
                spec_verify_ct=None, latency_s=2.0, budget_history=[3], continuations=0)
    (out,) = _run(_rows(handle, stage), [base])
    (sent,) = handle.sent
    assert (sent.input_ids, sent.prompt_len, sent.max_new_tokens, sent.messages) == (
        [1, 2, 5, 6, 7], 2, 97, None)
    assert (out["version"], out["completion_tokens"], out["budget_history"]) == (1, 4, [3, 100])
    assert out["output_token_ids"] == [5, 6, 7, 9] and out["latency_s"] == 3.0


def test_a_continue_failure_is_recorded_as_such():
    stage = _stage(RunMode.of_flags(continue_truncated=True, max_total_tokens=100))
    base = dict(_row("a"), prompt_token_ids=[1], output_token_ids=[2], completion_tokens=1)
    (out,) = _run(_rows(FakeReplica(_failed("bad_request")), stage), [base])
    assert out["error_class"] == "continuation:bad_request"


def test_only_a_continue_mode_puts_a_target_in_the_stage_settings():
    assert _stage(RunMode.of_flags(retry_failed=True)).continue_to is None
    assert _stage(RunMode.of_flags(pilot=10)).continue_to is None
    assert _stage(RunMode.of_flags(continue_truncated=True, max_total_tokens=9)).continue_to == 9
    with pytest.raises(AttributeError):  # frozen: shipped to every actor as is
        replace(_stage()).__setattr__("max_new_tokens", 1)


def _extended(r):
    """A continuation's result: the row's output ids and one more."""
    return GenerateResult(key=r.key, text="more", reasoning="", answer="more",
                          finished_thinking=True, prompt_token_ids=r.input_ids[:r.prompt_len],
                          output_token_ids=r.input_ids[r.prompt_len:] + [9],
                          finish_reason="stop", prompt_tokens=r.prompt_len, completion_tokens=1,
                          reasoning_tokens=0, max_new_tokens=r.max_new_tokens,
                          effective_max_new_tokens=r.max_new_tokens, latency_s=1.0,
                          budget_clamped_by="", replica="r0")


def _continued_row(key: str) -> dict:
    return dict(_row(key), version=0, prompt_token_ids=[1, 2], output_token_ids=[5, 6, 7],
                completion_tokens=3, reasoning_tokens=0, finished_thinking=True,
                spec_verify_ct=None, latency_s=2.0, budget_history=[3], continuations=0)


def _call(gen: GenerateRows, rows: list[dict]) -> pa.Table:
    return asyncio.run(gen(pa.Table.from_pylist(rows)))


def test_a_batch_without_a_column_the_session_reads_fails_at_the_door_naming_it():
    handle = FakeReplica(_ok)
    fresh = [{k: v for k, v in _row("a").items() if k != "messages"}]
    with pytest.raises(MissingColumn, match=r"^generate: input batch has no column "
                                            r"'messages' \(the prompt, JSON\); it has "):
        _call(_rows(handle, _stage()), fresh)
    stage = _stage(RunMode.of_flags(continue_truncated=True, max_total_tokens=100))
    cut = [{k: v for k, v in _continued_row("a").items() if k != "output_token_ids"}]
    with pytest.raises(MissingColumn, match="'output_token_ids'"):
        _call(_rows(FakeReplica(_extended), stage), cut)
    assert handle.sent == []  # refused before any request


@pytest.mark.parametrize("flags, answer, row, version", [
    ({}, _ok, _row("a"), 0),
    ({"continue_truncated": True, "max_total_tokens": 100}, _extended, _continued_row("a"), 1),
    ({"regenerate_flagged": True}, _ok, dict(_row("a"), version=4), 5),
])
def test_a_batch_of_exactly_the_declared_columns_is_enough(flags, answer, row, version):
    stage = _stage(RunMode.of_flags(**flags))
    declared = stage_inputs(stage).columns
    out = _call(_rows(FakeReplica(answer), stage), [{k: row[k] for k in declared}])
    assert out.column("_kind").to_pylist() == ["data"]
    assert out.column("version").to_pylist() == [version]
