"""Error classes shared by the replica and the job.

A failed *row* is data: the replica returns it as a result with ``error_class`` and
``retryable`` set, so one bad prompt never fails a batch. A failed *engine* raises
(EngineDead) so Serve's health check restarts the replica. The job branches on these
class names and on Ray's exception types, never on message text.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base: something went wrong talking to an engine."""

    retryable = False
    error_class = "engine_error"


class EngineUnavailable(EngineError):
    """Connection refused/reset, 503 while (re)starting, timeout: try again later."""

    retryable = True
    error_class = "engine_unavailable"


class EngineServerError(EngineError):
    """The engine answered 5xx: transient on a healthy fleet, so retried (bounded)."""

    retryable = True
    error_class = "engine_5xx"


class EngineBusy(EngineError):
    """408 Request Timeout / 429 Too Many Requests: the request was fine, the engine was
    not ready for it; retried with backoff."""

    retryable = True
    error_class = "engine_busy"


class EngineAborted(EngineError):
    """HTTP 200 but no completion: the engine aborted the request or hit NaN logits."""

    retryable = True
    error_class = "engine_abort"


class EngineBadRequest(EngineError):
    """The engine answered 4xx: the same request will fail again."""

    error_class = "bad_request"


class ContextOverflow(EngineBadRequest):
    """Prompt (+ budget, when the policy is ``reject``) does not fit the context."""

    error_class = "context_overflow"


class EngineDead(EngineError):
    """The engine process exited: the replica must be restarted by Serve."""

    retryable = True
    error_class = "engine_dead"


class EngineStartError(RuntimeError):
    """The engine did not become healthy in time, or exited while starting."""
