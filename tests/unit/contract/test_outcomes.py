"""contract.outcomes: every error class has a route, unknown names take the safe one,
and every class the job itself names (Ray-layer failures) is routed too."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from contract import outcomes
from contract.outcomes import ENGINE, ROUTES, ROW, SYSTEMATIC, RowOutcome, route
from jobs.pipeline.retry import CallIncomplete, replica_error_class


def _all_classes(cls=RowOutcome):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_classes(sub)


@pytest.mark.parametrize("cls", list(_all_classes()), ids=lambda c: c.__name__)
def test_every_error_class_has_its_own_route(cls):
    assert route(cls.error_class) is cls
    assert cls.breaker in (ENGINE, SYSTEMATIC, ROW)


def test_error_class_names_are_unique():
    names = [c.error_class for c in _all_classes()]
    assert len(names) == len(set(names)) == len(ROUTES) - 1  # - the RowOutcome default


def test_a_retried_class_counts_as_engine_health_once_its_retries_run_out():
    # A transient class that still fails after its retries says the fleet is unwell;
    # counting it as "systematic" would blame the config for an outage.
    assert all(c.breaker == ENGINE for c in _all_classes() if c.retryable)


def test_the_rows_own_fault_and_misconfiguration_are_not_retried():
    assert (route("context_overflow").retryable, route("context_overflow").breaker) == (False, ROW)
    assert (route("bad_request").retryable, route("bad_request").breaker) == (False, SYSTEMATIC)
    assert route("replica_error").retryable is False


def test_an_unknown_class_is_not_retried_kept_in_failures_and_counted_as_systematic():
    unknown = route("made_up_by_a_newer_replica")
    assert unknown is RowOutcome
    assert unknown.retryable is False and unknown.breaker == SYSTEMATIC
    assert "failures/" in unknown.fix


@pytest.mark.parametrize("exc", [
    ActorDiedError(), BackPressureError(num_queued_requests=1, max_queued_requests=1),
    DeploymentUnavailableError("engine"), CallIncomplete("short stream"),
    RayTaskError("generate_many", "tb", KeyError("x")),
    RayTaskError("generate_many", "tb", outcomes.EngineDead("gone")),
], ids=lambda e: type(e).__name__)
def test_every_class_the_job_names_for_a_ray_failure_is_routed(exc):
    assert replica_error_class(exc) in ROUTES
