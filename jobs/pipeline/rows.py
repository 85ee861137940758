"""Turn one request's outcome into a row for data/, failures/ or rejects/.

Pure functions, shared by the generate stage and continuation, so both write the
same columns (jobs/io/schema.py) the same way.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any, Optional

import pyarrow as pa

from jobs.io.schema import STAGE_OUTPUT



def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def settings_hash(model: str, sampling: dict[str, Any], chat_format: str = "chatml-think",
                  output_settings: Optional[dict[str, Any]] = None) -> str:
    """Hash of everything that changes an output (see output_settings); rows with
    different hashes must never mix in one run. Without ``output_settings`` this is
    the older formula (model + sampling + chat format), kept to recognise old runs."""
    fields: dict[str, Any] = {"model": model, "sampling": sampling, "chat": chat_format}
    if output_settings is not None:
        fields["output"] = output_settings
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def output_settings(engine: Any, context_policy: str) -> dict[str, Any]:
    """The settings besides sampling that change what a prompt's row holds: which model
    and name, how the prompt is rendered, how the output is split into reasoning and
    answer, the engine's own arguments, and what happens when the context is short.
    Not included: throughput settings (replicas, batch sizes, memory, speculative
    decoding, which verifies drafts against the model) and timeouts."""
    return {"kind": engine.kind, "model_path": engine.model_path,
            "served_model_name": engine.model_name, "chat_template": engine.chat_template,
            "reasoning_parser": engine.reasoning_parser,
            "think_end_token": engine.think_end_token,
            "extra_args": dict(sorted((engine.extra_args or {}).items())),
            "context_policy": context_policy}


def repetition_ratio(ids: list[int], n: int = 4) -> float:
    """Share of n-grams in the output that repeat an earlier one (0 = none, ~1 = loop)."""
    total = len(ids) - n + 1
    if total <= 0:
        return 0.0
    # zip over n shifted views: no per-window slice, ~3x less CPU than tuple(ids[i:i+n])
    return 1.0 - len(set(zip(*(ids[i:] for i in range(n))))) / total


def data_row(row: dict[str, Any], result: dict[str, Any], ctx: dict[str, Any],
             attempts: int) -> dict[str, Any]:
    out = {k: result.get(k) for k in (
        "reasoning", "answer", "finished_thinking", "prompt_token_ids", "output_token_ids",
        "finish_reason", "matched_stop", "prompt_tokens", "completion_tokens",
        "cached_tokens", "reasoning_tokens", "max_new_tokens", "effective_max_new_tokens",
        "budget_clamped_by", "spec_verify_ct", "accept_length", "latency_s", "replica")}
    out.update(
        _kind="data", key=row["key"], id=row["id"], version=0, category=row["category"],
        messages=row["messages"], tools=row["tools"], prompt_hash=row.get("prompt_hash"),
        budget_history=[result["max_new_tokens"]], continuations=0,
        repetition_ratio=repetition_ratio(result["output_token_ids"]),
        attempts=attempts, model=ctx["model"], sampling=ctx["sampling_json"],
        settings_hash=ctx["settings_hash"], created_at=now())
    return out


def _add(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None and b is None else (a or 0) + (b or 0)


def continued_row(base: dict[str, Any], result: dict[str, Any], ctx: dict[str, Any],
                  attempts: int) -> dict[str, Any]:
    """The next version of a truncated row: the whole output so far, counts added up."""
    new = result["completion_tokens"] or 0
    total = (base["completion_tokens"] or 0) + new
    verify = _add(base["spec_verify_ct"], result["spec_verify_ct"])
    reasoning_tokens = base["reasoning_tokens"] if base["finished_thinking"] else _add(
        base["reasoning_tokens"], result["reasoning_tokens"] if result["reasoning_tokens"]
        is not None else new)
    out = {k: v for k, v in base.items() if not k.startswith("__")}
    out.update({k: result.get(k) for k in (
        "reasoning", "answer", "finished_thinking", "output_token_ids", "finish_reason",
        "matched_stop", "cached_tokens", "budget_clamped_by", "replica")})
    out.update(
        _kind="data", version=base["version"] + 1, completion_tokens=total,
        reasoning_tokens=reasoning_tokens, max_new_tokens=ctx["continue_to"],
        effective_max_new_tokens=(base["completion_tokens"] or 0)
        + result["effective_max_new_tokens"],
        budget_history=list(base["budget_history"] or []) + [ctx["continue_to"]],
        continuations=(base["continuations"] or 0) + 1, spec_verify_ct=verify,
        accept_length=total / verify if verify else None,
        repetition_ratio=repetition_ratio(result["output_token_ids"]),
        latency_s=_add(base["latency_s"], result["latency_s"]), attempts=attempts,
        model=ctx["model"], sampling=ctx["sampling_json"],
        settings_hash=ctx["settings_hash"],  # its own (checked equal to the base's)
        created_at=now())
    return out


def failure_row(row: dict[str, Any], error_class: str, message: str, retryable: bool,
                attempts: int, ctx: dict[str, Any], replica: Optional[str] = None) -> dict:
    if ctx.get("continue_to"):  # the row stays in data/ (truncated); record why it stays so
        error_class = f"continuation:{error_class}"
    # context_overflow stays a failure (not a reject): --retry-failed sends it again
    # once engine.context_length or job.context_policy allows it.
    return {"_kind": "failures", "key": row["key"], "id": row["id"],
            "category": row["category"], "messages": row["messages"], "tools": row["tools"],
            "source": row.get("source"), "line": row.get("line"), "error_class": error_class,
            "error_message": message[:2000], "retryable": retryable, "attempts": attempts,
            "replica": replica, "settings_hash": ctx["settings_hash"], "failed_at": now()}


def reject_reason_class(reason: str) -> str:
    """Bounded label for the rejects metric."""
    if reason.startswith("duplicate id"):
        return "duplicate_id"
    if reason.startswith("context_overflow"):
        return "context_overflow"
    if reason.startswith("not valid JSON"):
        return "invalid_json"
    return "invalid_row"


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    cols = {name: [r.get(name) for r in rows] for name in STAGE_OUTPUT.names}
    return pa.table(cols, schema=STAGE_OUTPUT)
