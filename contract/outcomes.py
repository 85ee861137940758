"""Row outcomes: every error class, where its row goes, and what it tells the breaker.

A failed *row* is data: the replica returns a GenerateResult with ``error_class`` set,
so one bad prompt never fails a batch. A failed *engine* raises (EngineDead) so Serve's
health check restarts the replica. The job routes a failed row by looking its
``error_class`` name up in :data:`ROUTES` (:func:`route`), never by message text:

- ``retryable``: sent again with backoff (bounded by job.retries), then failures/;
  otherwise failures/ at once. --retry-failed sends failures/ rows again later.
- ``breaker``: ENGINE counts toward job.breaker.max_failure_fraction (the fleet may be
  down); SYSTEMATIC toward max_same_error_fraction (one class for every row: the run
  is misconfigured); ROW toward neither (the row's own fault).

Invalid input rows never get here: admission writes them to rejects/ before any
engine work (jobs/pipeline/admission.py).
"""

from __future__ import annotations

ENGINE = "engine"
SYSTEMATIC = "systematic"
ROW = "row"


class RowOutcome(Exception):
    """Base of every routed failure: the class attributes are its route."""

    error_class = "unknown"
    retryable = False
    breaker = SYSTEMATIC
    fix = "read error_message in <run>/failures/"  # the breaker's advice when it dominates


class EngineError(RowOutcome):
    """Base: something went wrong talking to an engine."""

    error_class = "engine_error"


class EngineUnavailable(EngineError):
    """Connection refused/reset, 503 while (re)starting, timeout: try again later."""

    error_class = "engine_unavailable"
    retryable, breaker = True, ENGINE


class EngineServerError(EngineError):
    """The engine answered 5xx: transient on a healthy fleet, so retried (bounded)."""

    error_class = "engine_5xx"
    retryable, breaker = True, ENGINE


class EngineBusy(EngineError):
    """408 Request Timeout / 429 Too Many Requests: the request was fine, the engine was
    not ready for it; retried with backoff."""

    error_class = "engine_busy"
    retryable, breaker = True, ENGINE


class EngineAborted(EngineError):
    """HTTP 200 but no completion: the engine aborted the request or hit NaN logits."""

    error_class = "engine_abort"
    retryable, breaker = True, ENGINE


class EngineBadRequest(EngineError):
    """The engine answered 4xx: the same request will fail again."""

    error_class = "bad_request"
    fix = ("the engine refuses the requests themselves: check job.sampling for a key this "
           "SGLang rejects (unknown sampling keys are a 400 since 0.5.22) and that "
           "engine.model_path/model_name and the engine endpoint are right (a 404 is a "
           "wrong path or model)")


class EngineMalformed(EngineError):
    """A 200 whose body lacks what the request asked for (job.logprobs: logprobs missing,
    or not one per output token): systematic, so an engine that never sends them (an
    SGLang without return_logprob) stops the run instead of failing every row."""

    error_class = "engine_malformed"
    fix = ("the engine does not answer what raygen asks (job.logprobs: SGLang's "
           "return_logprob); check engine.kind and its version, or unset job.logprobs")


class ContextOverflow(EngineBadRequest):
    """Prompt (+ budget, when the policy is ``reject``) does not fit the context. The
    row's own fault; it stays in failures/ so --retry-failed can send it again once
    engine.context_length or job.context_policy allows it."""

    error_class = "context_overflow"
    breaker = ROW


class EngineDead(EngineError):
    """The engine process exited: the replica must be restarted by Serve."""

    error_class = "engine_dead"
    retryable, breaker = True, ENGINE


class ReplicaError(RowOutcome):
    """The replica's own code raised on this row (a bug, not an outage)."""

    error_class = "replica_error"
    fix = ("replica code raised on these rows (a bug, not an outage): read the traceback in "
           "the Serve replica logs (Ray dashboard, Serve tab)")


class ReplicaUnavailable(RowOutcome):
    """Ray says the replica died or is restarting: sent again to another one."""

    error_class = "replica_unavailable"
    retryable, breaker = True, ENGINE


class ReplicaTimeout(ReplicaUnavailable):
    """A replica sent nothing back for longer than any of its rows may take (the engine's
    request timeout and a margin): the replica or its engine is stuck; sent again."""

    error_class = "replica_timeout"


class ReplicaBackpressure(ReplicaUnavailable):
    """Serve refused the call: every replica's queue is full."""

    error_class = "replica_backpressure"


class DeploymentUnavailable(ReplicaUnavailable):
    """The deployment has no running replica (being deployed or deleted)."""

    error_class = "deployment_unavailable"


class EngineStartError(RuntimeError):
    """The engine did not become healthy in time, or exited while starting (not a row
    outcome: the replica fails to start)."""


def _routes(cls: type[RowOutcome]) -> dict[str, type[RowOutcome]]:
    found = {cls.error_class: cls}
    for sub in cls.__subclasses__():
        found.update(_routes(sub))
    return found


ROUTES: dict[str, type[RowOutcome]] = _routes(RowOutcome)


def route(error_class: str) -> type[RowOutcome]:
    """The outcome of a class name. An unknown name (a newer replica, a typo) gets the
    safe route: not retried (it could be a poison row), kept in failures/ for
    --retry-failed, and counted as systematic so a flood of it stops the job."""
    return ROUTES.get(error_class, RowOutcome)
