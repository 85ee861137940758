"""What crosses the Serve boundary: one GenerateRequest in, one GenerateResult out.

Slots dataclasses, not pydantic: a 900K-row job sends ~1M of each through Ray, so
(de)serialisation is per-row overhead (``python -m bench.contract_pickle`` measures them
against plain dicts). No validation here: the job builds requests from validated rows.

GenerateResult is the ONE list of result columns: a field with ``column`` metadata is
stored in data/ as the replica sent it, with that Parquet type (jobs/io/schema.py
builds the data/ schema from it; tests/unit/contract/test_protocol.py keeps them in
sync). The other fields stay on the wire: ``key`` (the job's own row key), ``text``
(split into reasoning/answer), the error fields (a failure goes to failures/),
``request_id`` (the sender's id of the request it answers), ``engine_config_hash``
(the answering replica's engine: the job writes only rows of the engine it deployed, so
a row's ``settings_hash`` and ``model`` are what produced it) and ``drained`` (a drained
replica's condemned rows, which the job records: jobs/runs/regenerate.py) and
``assistant_spans`` (where the prompt's assistant turns lie in its ids: the job stores
them with its turns, jobs/pipeline/turns.py) and ``load`` (the engine's load as the
replica saw it: the job's rows in flight follow it, jobs/pipeline/inflight.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Optional


def _by_position(obj: Any) -> tuple:
    """Pickle as (class, field values): no field names on the wire (a slots dataclass
    would otherwise pickle a {name: value} dict per object, bigger than the old dicts)."""
    return type(obj), _VALUES[type(obj)](obj)


@dataclass(slots=True)
class GenerateRequest:
    key: str                                # stable row key (results are matched by it)
    run: str                                # metric label
    category: str                           # metric label (capped by the job)
    max_new_tokens: int                     # the budget of this request
    sampling: dict[str, Any]                # validated SGLang sampling params, + raygen's
                                            # max_thinking_tokens and thinking (false:
                                            # render with thinking off), which the
                                            # client moves out or drops (engine_client)
    context_policy: str = "reject"          # "clamp" (shrink the budget, recorded) | "reject"
    messages: Optional[list[dict[str, Any]]] = None  # the chat prompt ...
    tools: Optional[list[dict[str, Any]]] = None
    input_ids: Optional[list[int]] = None   # ... or token-exact ids (continuation)
    prompt_len: Optional[int] = None        # with input_ids: how many are the prompt
    request_id: str = ""                    # unique per send: results are matched by it
    assistant_spans: bool = False           # job.regenerate every_turn: say where the
                                            # prompt's assistant turns lie in its ids
    logprobs: Optional[int] = None          # job.logprobs: the top-N asked per output token
                                            # (0: the sampled token's only); None: none

    __reduce__ = _by_position


def _column(arrow_type: str) -> Any:
    """A result field stored in data/ as is; ``arrow_type`` names its Parquet type."""
    return field(default=None, metadata={"column": arrow_type})


@dataclass(slots=True)
class GenerateResult:
    key: str
    text: Optional[str] = None
    reasoning: Optional[str] = _column("string")          # text before </think>
    answer: Optional[str] = _column("string")             # text after it
    finished_thinking: Optional[bool] = _column("bool")
    prompt_token_ids: Optional[list[int]] = _column("token_ids")
    output_token_ids: Optional[list[int]] = _column("token_ids")
    finish_reason: Optional[str] = _column("string")      # stop | length | abort
    matched_stop: Optional[str] = _column("string")
    prompt_tokens: Optional[int] = _column("int32")
    completion_tokens: Optional[int] = _column("int32")
    cached_tokens: Optional[int] = _column("int32")
    reasoning_tokens: Optional[int] = _column("int32")
    max_new_tokens: Optional[int] = _column("int32")      # the budget asked for
    effective_max_new_tokens: Optional[int] = _column("int32")  # after the context guard
    budget_clamped_by: Optional[str] = _column("string")  # "" | context_guard | engine
    spec_verify_ct: Optional[int] = _column("int64")
    accept_length: Optional[float] = _column("float64")
    latency_s: Optional[float] = _column("float64")
    replica: Optional[str] = _column("string")
    # job.logprobs (None when off): per output token the sampled token's logprob and, top_k
    # > 0, the top ids and logprobs; a continuation's result has its new segment's only
    # (the job appends them to the row's: jobs/pipeline/rows.py continued_row).
    output_logprobs: Optional[list[float]] = _column("logprobs")
    output_top_logprob_ids: Optional[list[list[int]]] = _column("top_ids")
    output_top_logprobs: Optional[list[list[float]]] = _column("top_logprobs")
    error_class: Optional[str] = None  # contract.outcomes routes the row by this name
    error_message: Optional[str] = None
    request_id: str = ""  # the request's, echoed: a key sent twice still gets two answers
    engine_config_hash: str = ""  # of the replica that answered: rows from another engine
                                  # (the app redeployed under the run) are refused
    drained: Optional[dict[str, Any]] = None  # set once the replica drained: why, when and
                                  # the keys of this run it condemns (serve_apps/output_watch.py)
    assistant_spans: Optional[list[list[int]]] = None  # asked for: [start, end) in
                                  # prompt_token_ids of each assistant message of the prompt
    load: Optional[dict[str, Any]] = None  # the answering engine's load when it answered:
                                  # replica, cap, inflight, running, queued, token_usage,
                                  # retracted (counter), age_s (serve_apps/engine_load.py);
                                  # the job's adaptive rows in flight follow it

    __reduce__ = _by_position

    @classmethod
    def failed(cls, key: str, error_class: str, message: str,
               replica: str = "") -> "GenerateResult":
        """A failed row as data: error fields set, nothing generated."""
        return cls(key=key, error_class=error_class, error_message=message[:2000],
                   replica=replica)

    # A mapping too, for callers that unpack a replica's output with ** (ray.data.llm's
    # ServeDeploymentStage does: bench/raydata_llm.py).
    def keys(self) -> tuple[str, ...]:
        return _FIELD_NAMES

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)


_FIELD_NAMES = tuple(f.name for f in fields(GenerateResult))
# Each type's field values as one tuple, in field order (one C call per pickle).
_VALUES = {cls: attrgetter(*cls.__slots__) for cls in (GenerateRequest, GenerateResult)}
# name -> Parquet type name of every result column data/ stores as is, in field order.
RESULT_COLUMNS: dict[str, str] = {f.name: f.metadata["column"] for f in fields(GenerateResult)
                                  if "column" in f.metadata}
