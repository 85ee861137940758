"""Send rows to the engine replicas (stage 4 of the job): an async Ray Data actor.

Row contract (the columns it needs: ``stage_inputs``, checked per batch): reads an
admitted row (key, id, category, messages, tools, source, line, prompt_hash, and
sample + seed with job.samples_per_prompt > 1; rejects never get here: the driver's
admission pass writes them) or, in a
continue, regenerate or next-turn session, a data/ row (continued token-exactly,
regenerated: its prompt sent again, or its conversation's next turn, each written as its
next version); outputs STAGE_OUTPUT rows whose ``_kind`` says where they go (data /
failures). What differs by mode (the columns, the request, the row, the failure row,
the breaker's flags verdict) is the mode's strategy's (jobs/pipeline/modes.py), asked
through ``StageSettings.strategy``; this stage only sends, retries and judges.

Each actor keeps rows in flight across all its concurrent batches (row-level slots,
``jobs.pipeline.row_sender``), so when one row finishes the next one starts at once: a
slow 8K-token row holds one slot, not its whole batch. How many: with job.inflight
adaptive (the default) as many as the engines' reported load allows
(jobs/pipeline/inflight.py), at most ``inflight_rows_per_actor``; fixed, exactly that. Rows
ready together share one handle call (``job.rows_per_call``). A failed row is routed by
its error class (contract.outcomes): retried with backoff, or a failure row; the
breaker stops the job when the fleet is down or the run is misconfigured. A result
from a drained replica carries the rows it condemns: recorded under the run before the
row is returned (jobs/io/condemned.py).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import pyarrow as pa
from ray import serve

from contract.outcomes import ENGINE, ROW, route
from contract.protocol import GenerateRequest
from jobs.pipeline.category_cap import CategoryCap
from jobs.pipeline.inflight import InflightControl
from jobs.pipeline.integrity_metrics import IntegrityCounters
from jobs.pipeline.retry import (REPLICA_ERRORS, Breaker, ForeignEngine, backoff_s,
                                 error_text, is_replica_bug, replica_error_class)
from jobs.pipeline.row_sender import RowSender
from jobs.pipeline.rows import to_table
from jobs.pipeline.settings import StageSettings
from jobs.pipeline.stage_inputs import StageInputs
from jobs.io.condemned import write_record
from jobs.io.run_store import RunStore


def stage_inputs(stage: StageSettings) -> StageInputs:
    """The columns this session's rows must carry (its mode's)."""
    return stage.strategy.inputs


def stage_breaker(stage: StageSettings) -> Breaker:
    """The session's breaker (jobs.pipeline.retry): job.breaker, without the fleet-wide
    flags verdict for rows chosen by their earlier output (the mode says: regenerate,
    flagged or condemned; continue, cut at the budget, where loops gather), whose flag
    rate says nothing about the fleet."""
    settings = stage.breaker.model_dump()
    if not stage.strategy.judges_flags:
        settings["max_flagged_fraction"] = None
    return Breaker(**settings)


class GenerateRows:
    def __init__(self, app_name: str, deployment_name: str, stage: StageSettings,
                 run_store: Optional[RunStore] = None):
        self.stage, self.run_store = stage, run_store  # run_store: where drains are recorded
        self.recorded: set[str] = set()  # replicas whose drain this actor has recorded
        handle = serve.get_deployment_handle(deployment_name, app_name=app_name)
        control = (InflightControl(1, stage.inflight_rows_per_actor)
                   if stage.inflight == "adaptive" else None)
        self.sender = RowSender(handle, stage.inflight_rows_per_actor, stage.rows_per_call,
                                stage.call_linger_s, stage.call_timeout_s, control)
        self.retries = stage.retries
        self.breaker = stage_breaker(stage)
        self.category_label = CategoryCap(stage.metrics_category_limit)
        self.integrity = IntegrityCounters(stage.run, stage.model)

    def _request(self, row: dict[str, Any]) -> GenerateRequest:
        return self.stage.strategy.request(row, self.stage, self.category_label(row["category"]))

    def _data_row(self, row: dict[str, Any], result, attempt: int) -> dict[str, Any]:
        return self.stage.strategy.data_row(row, result, self.stage, attempt)

    async def _one(self, row: dict[str, Any]) -> dict[str, Any]:
        request, attempt, retried, alone = self._request(row), 0, [], False
        while True:
            attempt += 1
            try:
                result = await self.sender.send(request, alone=alone)
                self._check_engine(result)
                error_class, message, replica = (result.error_class, result.error_message,
                                                 result.replica)
                retryable = error_class is not None and route(error_class).retryable
            except REPLICA_ERRORS as exc:
                result, error_class = None, replica_error_class(exc)
                message, replica = error_text(exc), None
                # Replica code raised: resend alone once (a poison row in the same call
                # must not fail this one), then it is this row's own bug: no more tries.
                if is_replica_bug(exc) and not alone:
                    alone, attempt = True, attempt - 1
                    continue
                retryable = route(error_class).retryable
            if error_class is None:
                self.breaker.record(False)
                if result.drained:
                    await self._record_drain(result.drained)
                out = self._data_row(row, result, attempt)
                self.integrity.record(result.replica, out["integrity_flags"])
                self.breaker.record_output(result.replica, out["integrity_flags"], row["key"])
                return dict(out, retry_classes=retried)
            if retryable and attempt < self.retries.max_attempts:
                retried.append(error_class)
                await asyncio.sleep(backoff_s(attempt, self.retries.backoff_initial_s,
                                              self.retries.backoff_max_s))
                continue
            out = self.stage.strategy.failed(row, error_class, message, attempt, self.stage,
                                             replica, retryable)
            self._judge(error_class, message)
            return dict(out, retry_classes=retried)

    async def _record_drain(self, drained: dict) -> None:
        """Once per drained replica and actor; the same bytes whoever writes them."""
        if self.run_store is None or drained["replica"] in self.recorded:
            return
        await asyncio.to_thread(write_record, self.run_store, drained)
        self.recorded.add(drained["replica"])

    def _check_engine(self, result) -> None:
        """Only rows from the engine this run deployed are this run's rows (their model
        and settings_hash are then what produced them)."""
        want = self.stage.engine_config_hash
        if want and result.engine_config_hash != want:
            raise ForeignEngine(
                f"replica {result.replica or '?'} of Serve app {self.stage.app_name!r} "
                f"answered with engine {result.engine_config_hash or '(none reported)'}, "
                f"not this run's {want}: the app was redeployed under the run (another job, "
                f"`serve deploy` or a RayService update with the same serve.app_name). "
                f"None of its rows was written. Give this run its own serve.app_name or "
                f"stop the other deployer, then rerun the same command to resume.")

    def _judge(self, error_class: str, message: str) -> None:
        """Feed the breaker (raises CircuitOpen when the window says stop the job)."""
        breaker = route(error_class).breaker
        if breaker == ROW:
            self.breaker.record(False)
        elif breaker == ENGINE:
            self.breaker.record(True)
        else:
            self.breaker.record(False, error_class, message)

    async def __call__(self, batch: pa.Table) -> pa.Table:
        stage_inputs(self.stage).check(batch)
        outs = await asyncio.gather(*(self._one(r) for r in batch.to_pylist()))
        return to_table(outs)
