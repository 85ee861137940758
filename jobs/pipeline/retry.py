"""Which failures to retry, how long to wait, and when to stop the whole job.

Classification is by type: results carry the ``error_class`` the replica set, which
contract.outcomes routes; exceptions from the Ray/Serve layer (replica died,
restarting, overloaded) map to its Replica* outcomes and are transient. An exception raised by the replica's own code (a RayTaskError that is
not Ray reporting a dead actor) is a bug, not an outage: its rows are sent again one
per call, so a poison prompt fails alone, and then fail without further retries.

The circuit breaker stops the job in two cases: engine-class failures (5xx, dead or
unreachable engines after their retries) exceed ``max_failure_fraction`` of the
window (the fleet is down), or one non-transient error class (a 400 for every row:
an unknown sampling key, a wrong endpoint; a replica bug) exceeds
``max_same_error_fraction`` (the run is misconfigured). A context overflow is the
row's own fault and never counts. Each outcome class says which count it feeds.

It also stops the job when outputs are broken across the fleet, not on one engine:
more than ``max_flagged_fraction`` of the window's data rows carry integrity flags
(contract/integrity.py) on each of at least two replicas, a majority of those seen.
One broken replica drains and is replaced (serve_apps/output_watch.py); when its
replacement or its peers are as broken, a drain cannot help (a non-thinking model with
a thinking run's settings flags every row missing_think_end) and every replica would
restart over and over, each restart minutes of GPU time, for rows export leaves out.
"""

from __future__ import annotations

import collections
import random
from typing import Optional

from ray.exceptions import (ActorDiedError, ActorUnavailableError, RayActorError, RayError,
                            RayTaskError)
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from contract.outcomes import (DeploymentUnavailable, EngineError, ReplicaBackpressure,
                               ReplicaError, ReplicaTimeout, ReplicaUnavailable, route)


class CallIncomplete(RuntimeError):
    """A replica's result stream ended without some of its rows (they are sent again)."""


class CallTimedOut(RuntimeError):
    """A replica's result stream sent nothing before the call's deadline (sent again)."""


# Exceptions raised by a handle call when the replica (not the row) is the problem.
REPLICA_ERRORS = (RayActorError, ActorDiedError, ActorUnavailableError, BackPressureError,
                  DeploymentUnavailableError, RayTaskError, CallIncomplete, CallTimedOut)

class CircuitOpen(RuntimeError):
    """Too many engine failures in a row window: the fleet is down."""


class SystematicErrors(CircuitOpen):
    """One non-transient error class dominates the window: the run is misconfigured."""


class FlaggedEverywhere(CircuitOpen):
    """Most outputs of most replicas are flagged: the cause is the run, not an engine."""


class ForeignEngine(CircuitOpen):
    """A result came from a replica whose engine is not the one this run deployed: the
    app was redeployed under the run (another job, `serve deploy`, a RayService update).
    One such row is proof, not a rate: the run stops and the row is not written."""


def is_replica_bug(exc: BaseException) -> bool:
    """The replica's own code raised: not Ray telling us the replica died, and not an
    engine fault the replica raises on purpose (EngineDead: Serve replaces the replica)."""
    return isinstance(exc, RayTaskError) and not isinstance(getattr(exc, "cause", None),
                                                            (RayError, EngineError))


def error_text(exc: BaseException) -> str:
    """One line for failures/: a replica bug by its own exception, not Ray's wrapper."""
    if is_replica_bug(exc) and exc.cause is not None:
        return f"replica code raised {type(exc.cause).__name__}: {exc.cause}"
    return f"{type(exc).__name__}: {exc}"


def replica_error_class(exc: BaseException) -> str:
    if is_replica_bug(exc):
        return ReplicaError.error_class
    if isinstance(getattr(exc, "cause", None), EngineError):
        return exc.cause.error_class  # e.g. engine_dead: retried on the replacement
    return {BackPressureError: ReplicaBackpressure,
            DeploymentUnavailableError: DeploymentUnavailable,
            CallTimedOut: ReplicaTimeout}.get(type(exc), ReplicaUnavailable).error_class


def backoff_s(attempt: int, initial_s: float, max_s: float) -> float:
    """Exponential backoff with full jitter (attempt 1 = first retry)."""
    return random.uniform(0, min(max_s, initial_s * (2 ** (attempt - 1))))


# A replica's flagged share is judged once it has this many data rows in the window.
FLAG_MIN_ROWS_PER_REPLICA = 10


class Breaker:
    def __init__(self, window_rows: int, min_rows: int, max_failure_fraction: float,
                 max_same_error_fraction: float = 0.8,
                 max_flagged_fraction: Optional[float] = None):
        self.window: collections.deque[bool] = collections.deque(maxlen=window_rows)
        self.classes: collections.deque[Optional[str]] = collections.deque(maxlen=window_rows)
        self.examples: dict[str, str] = {}  # class -> its latest message, for the verdict
        self.min_rows, self.max_fraction = min_rows, max_failure_fraction
        self.max_same = max_same_error_fraction
        self.max_flagged = max_flagged_fraction
        # (replica, flags, key) of the latest data rows
        self.outputs: collections.deque[tuple[str, tuple[str, ...], str]] = \
            collections.deque(maxlen=window_rows)

    def record_output(self, replica: str, flags: list[str], key: str = "") -> None:
        """One data row and its integrity flags; raises FlaggedEverywhere (see above)."""
        if self.max_flagged is None:
            return
        self.outputs.append((replica or "?", tuple(flags), key))
        if len(self.outputs) < self.min_rows or not flags:
            return
        rows: collections.Counter = collections.Counter()
        flagged: collections.Counter = collections.Counter()
        for rep, row_flags, _ in self.outputs:
            rows[rep] += 1
            flagged[rep] += bool(row_flags)
        judged = [r for r, n in rows.items() if n >= FLAG_MIN_ROWS_PER_REPLICA]
        over = [r for r in judged if flagged[r] / rows[r] > self.max_flagged]
        if len(over) < 2 or 2 * len(over) <= len(judged):
            return
        kinds = collections.Counter(f for _, row_flags, _ in self.outputs for f in row_flags)
        example = next(k for _, row_flags, k in reversed(self.outputs) if row_flags)
        raise FlaggedEverywhere(
            f"{sum(flagged.values())} of the last {len(self.outputs)} rows are flagged by the "
            f"integrity guard, more than job.breaker.max_flagged_fraction "
            f"{self.max_flagged:.0%} on {len(over)} of the {len(judged)} replicas that "
            f"produced them ({', '.join(f'{f} {n}' for f, n in kinds.most_common())}; e.g. "
            f"key {example!r}). Outputs broken on every engine are the run's settings, not "
            f"one engine (draining would restart them all, over and over): a non-thinking "
            f"model flags every row missing_think_end (raygen's runs are thinking runs: "
            f"engine.think_end_token, the chat template), loops point at sampling "
            f"(temperature 0 on a thinking model) or the engine version. Rows already "
            f"written are kept; rerun the same command once fixed, and --regenerate-flagged "
            f"sends the flagged ones again.")

    def record(self, engine_failure: bool, error_class: Optional[str] = None,
               message: str = "") -> None:
        """One finished row: an engine failure, or a non-transient class (None = ok)."""
        self.window.append(engine_failure)
        self.classes.append(error_class)
        if error_class:
            self.examples[error_class] = message
        if len(self.window) < self.min_rows:
            return
        fraction = sum(self.window) / len(self.window)
        if fraction > self.max_fraction:
            raise CircuitOpen(
                f"{sum(self.window)} of the last {len(self.window)} rows failed with "
                f"engine errors ({fraction:.0%} > job.breaker.max_failure_fraction "
                f"{self.max_fraction:.0%}). The engine fleet looks down: check "
                f"`serve status` and the replica logs, then rerun the same command "
                f"to resume (add --retry-failed to redo the failed rows). Rows "
                f"already written are kept.")
        counts = collections.Counter(c for c in self.classes if c)
        if not counts:
            return
        top, n = counts.most_common(1)[0]
        if n / len(self.classes) > self.max_same:
            fix = route(top).fix
            raise SystematicErrors(
                f"{n} of the last {len(self.classes)} rows failed with the same "
                f"non-transient error {top!r} ({n / len(self.classes):.0%} > "
                f"job.breaker.max_same_error_fraction {self.max_same:.0%}), e.g. "
                f"{self.examples[top][:300]!r}. Fix: {fix}; then rerun with --retry-failed "
                f"to redo the failed rows. Rows already written are kept.")
