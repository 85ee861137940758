"""Turn one request's outcome into a row for data/ or failures/.

Pure functions, shared by the generate stage and continuation, so both write the
same columns (jobs/io/schema.py) the same way.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Optional

import pyarrow as pa

from contract.integrity import integrity_flags, repetition_ratio
from contract.outcomes import route
from contract.protocol import RESULT_COLUMNS, GenerateResult
from jobs.io.schema import LOGPROB_COLUMNS, STAGE_OUTPUT

if TYPE_CHECKING:  # settings asks the mode strategies (jobs/pipeline/modes.py), which use these
    from jobs.pipeline.settings import StageSettings


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _generated(result: GenerateResult) -> dict[str, Any]:
    """The result's columns that data/ stores as the replica sent them."""
    return {name: getattr(result, name) for name in RESULT_COLUMNS}


def data_row(row: dict[str, Any], result: GenerateResult, stage: "StageSettings",
             attempts: int) -> dict[str, Any]:
    out = _generated(result)
    out.update(
        _kind="data", key=row["key"], id=row["id"], version=0, category=row["category"],
        messages=row["messages"], tools=row["tools"], prompt_hash=row.get("prompt_hash"),
        budget_history=[result.max_new_tokens], continuations=0,
        repetition_ratio=repetition_ratio(result.output_token_ids),
        attempts=attempts, settings_hash=stage.settings_hash, created_at=now(),
        sample=row.get("sample"), seed=row.get("seed"),  # a regenerated row keeps its own
        **_setting_columns(row, stage))
    out["integrity_flags"] = integrity_flags(out)
    return out


def _setting_columns(row: dict[str, Any], stage: "StageSettings") -> dict[str, Any]:
    """The columns of the row's sampling setting (one, or its draw of a mix)."""
    setting = stage.setting_of(row)
    return {"model": stage.model, "sampling": setting.sampling_json,
            "max_thinking_tokens": setting.max_thinking_tokens, "setting": setting.name}


def _add(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None and b is None else (a or 0) + (b or 0)


def continued_row(base: dict[str, Any], result: GenerateResult, stage: "StageSettings",
                  attempts: int) -> dict[str, Any]:
    """The next version of a truncated row: the whole output so far, counts added up
    (the result's prompt ids and count are the base's: they were sent as input_ids)."""
    new = result.completion_tokens or 0
    total = (base["completion_tokens"] or 0) + new
    verify = _add(base["spec_verify_ct"], result.spec_verify_ct)
    reasoning_tokens = base["reasoning_tokens"] if base["finished_thinking"] else _add(
        base["reasoning_tokens"], result.reasoning_tokens if result.reasoning_tokens
        is not None else new)
    out = {k: v for k, v in base.items() if not k.startswith("__")}
    out.update(_generated(result))
    out.update(
        _kind="data", version=base["version"] + 1, completion_tokens=total,
        reasoning_tokens=reasoning_tokens, max_new_tokens=stage.continue_to,
        effective_max_new_tokens=(base["completion_tokens"] or 0)
        + result.effective_max_new_tokens,
        budget_history=list(base["budget_history"] or []) + [stage.continue_to],
        continuations=(base["continuations"] or 0) + 1, spec_verify_ct=verify,
        accept_length=total / verify if verify else None,
        repetition_ratio=repetition_ratio(result.output_token_ids),
        latency_s=_add(base["latency_s"], result.latency_s), attempts=attempts,
        settings_hash=stage.settings_hash,  # its own (checked equal to the base's)
        created_at=now(), **_setting_columns(base, stage),
        **continued_logprobs(base, result))
    out["integrity_flags"] = integrity_flags(out)  # of the whole output, this version's
    return out


def continued_logprobs(base: dict[str, Any], result: GenerateResult) -> dict[str, Any]:
    """job.logprobs: the base row's per-token lists with the new segment's appended (the
    result carries its own tokens' only), one entry per token of the whole output.
    Both null (logprobs off) stay null."""
    out = {}
    for name in LOGPROB_COLUMNS:
        old, new = base.get(name), getattr(result, name)
        if (old is None) != (new is None):
            raise ValueError(
                f"row {base.get('key')!r}: {name} is {'missing' if old is None else 'held'} "
                f"in its version {base.get('version')} and {'sent' if new is not None else 'not sent'} "
                f"by its continuation: a row continued under another job.logprobs than it was "
                f"made with (settings_hash should have refused it)")
        out[name] = None if old is None else list(old) + list(new)
    sampled = out["output_logprobs"]
    if sampled is not None and len(sampled) != len(result.output_token_ids or ()):
        raise ValueError(
            f"row {base.get('key')!r}: {len(sampled)} output_logprobs after its continuation "
            f"for {len(result.output_token_ids or ())} output tokens (version "
            f"{base.get('version')} held {len(base['output_logprobs'])})")
    return out


def failure_row(row: dict[str, Any], error_class: str, message: str, attempts: int,
                stage: "StageSettings", replica: Optional[str] = None,
                prefix: str = "") -> dict:
    """A failures/ row; ``prefix`` (the mode's, jobs/pipeline/modes.py) marks a failure
    whose row stays in data/ (a continuation or a turn round), saying why."""
    retryable = route(error_class).retryable
    error_class = f"{prefix}{error_class}"
    return {"_kind": "failures", "key": row["key"], "id": row["id"],
            "category": row["category"], "messages": row["messages"], "tools": row["tools"],
            "source": row.get("source"), "line": row.get("line"), "error_class": error_class,
            "error_message": message[:2000], "retryable": retryable,
            "attempts": attempts, "replica": replica, "settings_hash": stage.settings_hash,
            "failed_at": now(), "sample": row.get("sample")}


def stopped_row(base: dict[str, Any], error_class: str, attempts: int) -> dict[str, Any]:
    """job.regenerate every_turn: a round's permanent failure ends the conversation with
    the turns it has: the row again, as its next version, saying why (turn_stop)."""
    out = {k: v for k, v in base.items() if not k.startswith("__")}
    out.update(_kind="data", version=base["version"] + 1, turn_stop=f"error:{error_class}",
               attempts=attempts, created_at=now())
    return out


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    cols = {name: [r.get(name) for r in rows] for name in STAGE_OUTPUT.names}
    return pa.table(cols, schema=STAGE_OUTPUT)
