"""Which failures to retry, how long to wait, and when to stop the whole job.

Classification is by type: results carry ``error_class``/``retryable`` set by the
replica; exceptions from the Ray/Serve layer (replica died, restarting, overloaded)
are transient. The circuit breaker watches engine-class failures only: a context
overflow is the row's fault, a fleet answering 5xx to everything is not.
"""

from __future__ import annotations

import collections
import random

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError



class CallIncomplete(RuntimeError):
    """A replica's result stream ended without some of its rows (they are sent again)."""


# Exceptions raised by a handle call when the replica (not the row) is the problem.
REPLICA_ERRORS = (RayActorError, ActorDiedError, ActorUnavailableError, BackPressureError,
                  DeploymentUnavailableError, RayTaskError, CallIncomplete)
ROW_ERROR_CLASSES = {"context_overflow", "bad_request"}


class CircuitOpen(RuntimeError):
    """Too many engine failures in a row window: the fleet is down."""


def replica_error_class(exc: BaseException) -> str:
    return {BackPressureError: "replica_backpressure",
            DeploymentUnavailableError: "deployment_unavailable"}.get(type(exc),
                                                                       "replica_unavailable")


def backoff_s(attempt: int, initial_s: float, max_s: float) -> float:
    """Exponential backoff with full jitter (attempt 1 = first retry)."""
    return random.uniform(0, min(max_s, initial_s * (2 ** (attempt - 1))))


class Breaker:
    def __init__(self, window_rows: int, min_rows: int, max_failure_fraction: float):
        self.window: collections.deque[bool] = collections.deque(maxlen=window_rows)
        self.min_rows, self.max_fraction = min_rows, max_failure_fraction

    def record(self, engine_failure: bool) -> None:
        self.window.append(engine_failure)
        if len(self.window) >= self.min_rows:
            fraction = sum(self.window) / len(self.window)
            if fraction > self.max_fraction:
                raise CircuitOpen(
                    f"{sum(self.window)} of the last {len(self.window)} rows failed with "
                    f"engine errors ({fraction:.0%} > job.breaker.max_failure_fraction "
                    f"{self.max_fraction:.0%}). The engine fleet looks down: check "
                    f"`serve status` and the replica logs, then rerun the same command "
                    f"to resume (add --retry-failed to redo the failed rows). Rows "
                    f"already written are kept.")
