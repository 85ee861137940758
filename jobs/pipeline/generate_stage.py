"""Send rows to the engine replicas (stage 4 of the job): an async Ray Data actor.

Row contract: reads an admitted row (key, id, category, messages, tools, source, line,
prompt_hash; rejects never get here: the driver's admission pass writes them) or, when
continuing (ctx["continue_to"]), a data/ row; outputs STAGE_OUTPUT rows whose ``_kind``
says where they go (data / failures).

Each actor keeps ``inflight_rows_per_actor`` requests in flight across all its
concurrent batches (row-level slots, ``jobs.pipeline.row_sender``), so when one row finishes the
next one starts at once: a slow 8K-token row holds one slot, not its whole batch. Rows
ready together share one handle call (``job.rows_per_call``). Transient
errors are retried with backoff; permanent ones become failure rows; the breaker
stops the job when the fleet is down.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pyarrow as pa
from ray import serve

from jobs.runs.job_metrics import CategoryCap
from jobs.pipeline.retry import (NOT_ENGINE_CLASSES, REPLICA_ERRORS, ROW_ERROR_CLASSES, Breaker,
                        backoff_s, error_text, is_replica_bug, replica_error_class)
from jobs.pipeline.row_sender import RowSender
from jobs.pipeline.rows import continued_row, data_row, failure_row, to_table


class GenerateRows:
    def __init__(self, app_name: str, deployment_name: str, ctx: dict[str, Any]):
        self.ctx = ctx
        handle = serve.get_deployment_handle(deployment_name, app_name=app_name)
        self.sender = RowSender(handle, ctx["inflight_rows_per_actor"], ctx["rows_per_call"],
                                ctx["call_linger_s"])
        self.retries = ctx["retries"]
        self.breaker = Breaker(**ctx["breaker"])
        self.category_label = CategoryCap(ctx["metrics_category_limit"])

    def _request(self, row: dict[str, Any]) -> dict[str, Any]:
        request = {"key": row["key"], "run": self.ctx["run"],
                   "category": self.category_label(row["category"]),  # a metrics label only
                   "messages": None, "tools": None, "input_ids": None, "prompt_len": None,
                   "max_new_tokens": self.ctx["max_new_tokens"],
                   "sampling": self.ctx["sampling"],
                   "context_policy": self.ctx["context_policy"]}
        if self.ctx.get("continue_to"):  # token-exact: prompt ids + output ids, as ids
            prompt = list(row["prompt_token_ids"])
            request.update(input_ids=prompt + list(row["output_token_ids"]),
                           prompt_len=len(prompt),
                           max_new_tokens=self.ctx["continue_to"] - row["completion_tokens"])
        else:
            request.update(messages=json.loads(row["messages"]),
                           tools=json.loads(row["tools"]) if row["tools"] else None)
        return request

    async def _one(self, row: dict[str, Any]) -> dict[str, Any]:
        request, attempt, retried, alone = self._request(row), 0, [], False
        while True:
            attempt += 1
            try:
                result = await self.sender.send(request, alone=alone)
                error_class, retryable = result["error_class"], bool(result["retryable"])
                message, replica = result["error_message"], result["replica"]
            except REPLICA_ERRORS as exc:
                result, error_class = None, replica_error_class(exc)
                message, replica = error_text(exc), None
                # Replica code raised: resend alone once (a poison row in the same call
                # must not fail this one), then it is this row's own bug: no more tries.
                retryable = not (is_replica_bug(exc) and alone)
                if is_replica_bug(exc) and not alone:
                    alone, attempt = True, attempt - 1
                    continue
            if error_class is None:
                self.breaker.record(False)
                if self.ctx.get("continue_to"):
                    out = continued_row(row, result, self.ctx, attempt)
                else:
                    out = data_row(row, result, self.ctx, attempt)
                return dict(out, retry_classes=retried)
            if retryable and attempt < self.retries["max_attempts"]:
                retried.append(error_class)
                await asyncio.sleep(backoff_s(attempt, self.retries["backoff_initial_s"],
                                              self.retries["backoff_max_s"]))
                continue
            out = failure_row(row, error_class, message, retryable, attempt, self.ctx, replica)
            self._judge(error_class, retryable, message)
            return dict(out, retry_classes=retried)

    def _judge(self, error_class: str, retryable: bool, message: str) -> None:
        """Feed the breaker (raises CircuitOpen when the window says stop the job)."""
        if error_class in ROW_ERROR_CLASSES:
            self.breaker.record(False)
        elif error_class in NOT_ENGINE_CLASSES or not retryable:
            self.breaker.record(False, error_class, message)
        else:
            self.breaker.record(True)

    async def __call__(self, batch: pa.Table) -> pa.Table:
        outs = await asyncio.gather(*(self._one(r) for r in batch.to_pylist()))
        return to_table(outs)
