"""raygen's key signals as PromQL, shared by dashboard panels and alert rules.

Panels call these with the template-variable matchers (``promql.RUN_MODEL``);
recording rules call them without matchers so alerts cover every run.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from dashboards import metrics_catalog as mc
from dashboards import promql as q

RUN_MODEL = ("run", "model")
# A fleet: the replicas serving one model for one run. Replica-side series name their
# replica with Serve's ``replica`` label; the job's integrity counters name the replica
# that produced a row ``engine_replica`` (same value).
FLEET = ("model", "run")
SERVE_REPLICA = FLEET + ("replica",)
ENGINE_REPLICA = FLEET + ("engine_replica",)


def output_tps(window: str, by: Sequence[str] = RUN_MODEL, matchers: Iterable[str] = ()) -> str:
    """Completion tokens per second, summed over replicas."""
    return q.sum_rate(mc.OUTPUT_TOKENS.prom_name, window, by, matchers)


def truncated_fraction(window: str, by: Sequence[str] = RUN_MODEL, matchers: Iterable[str] = ()) -> str:
    """Share of completions that stopped at the length limit over ``window``.

    0 (not "No data") while nothing was truncated; 0 when nothing completed.
    """
    matchers = tuple(matchers)
    total = q.sum_rate(mc.COMPLETIONS.prom_name, window, by, matchers)
    length = q.sum_rate(mc.COMPLETIONS.prom_name, window, by, matchers, finish_reason="length")
    return q.safe_ratio(q.or_zero(length, total), total)


def failure_ratio(window: str, by: Sequence[str] = ("run",), matchers: Iterable[str] = ()) -> str:
    """failures / (completions + failures).

    Completions are zero-filled from the failures side: when *everything* fails
    the completions counter may not exist at all, and a plain ``+`` would then
    return nothing -- exactly the case that must alert.
    """
    matchers = tuple(matchers)
    failures = q.sum_rate(mc.FAILURES.prom_name, window, by, matchers)
    completions = q.sum_rate(mc.COMPLETIONS.prom_name, window, by, matchers)
    return q.safe_ratio(failures, f"({failures} + {q.or_zero(completions, failures)})")


def accept_length(window: str, by: Sequence[str] = RUN_MODEL, matchers: Iterable[str] = ()) -> str:
    """Tokens per verify step from counters; no sample when there was no speculative traffic."""
    matchers = tuple(matchers)
    return q.ratio_if_positive(
        q.sum_rate(mc.SPEC_OUTPUT_TOKENS.prom_name, window, by, matchers),
        q.sum_rate(mc.SPEC_VERIFY_STEPS.prom_name, window, by, matchers),
    )


def rows_checked(window: str, by: Sequence[str] = ENGINE_REPLICA, matchers: Iterable[str] = ()) -> str:
    """Rows per second the integrity guard checked."""
    return q.sum_rate(mc.ROWS_CHECKED.prom_name, window, by, matchers)


def flags(window: str, by: Sequence[str] = ENGINE_REPLICA, matchers: Iterable[str] = ()) -> str:
    """Integrity flags per second (a row with two flags counts twice), 0 where rows were
    checked but none flagged (the flagged series only exists after the first flag)."""
    matchers = tuple(matchers)
    return q.or_zero(q.sum_rate(mc.ROWS_FLAGGED.prom_name, window, by, matchers),
                     rows_checked(window, by, matchers))


def flagged_rate(window: str, by: Sequence[str] = ENGINE_REPLICA, matchers: Iterable[str] = ()) -> str:
    """Flags per checked row over ``window``; no sample where nothing was checked."""
    matchers = tuple(matchers)
    return q.ratio_if_positive(flags(window, by, matchers), rows_checked(window, by, matchers))


def job_running(by: Sequence[str] = RUN_MODEL, matchers: Iterable[str] = ()) -> str:
    """1 per run whose driver is alive and reports running (filter, not a value)."""
    return f"({q.max_by(by, q.sel(mc.JOB_RUNNING.prom_name, *matchers))} == 1)"


def seconds_since_last_write(by: Sequence[str] = RUN_MODEL, matchers: Iterable[str] = ()) -> str:
    return f"(time() - {q.max_by(by, q.sel(mc.JOB_LAST_WRITE_TIMESTAMP.prom_name, *matchers))})"


def rows_finished(by: Sequence[str] = RUN_MODEL, matchers: Iterable[str] = (), over: str = "") -> str:
    """done + failed + rejected; with ``over`` the last value seen in that window."""
    def g(m: mc.Metric) -> str:
        s = q.sel(m.prom_name, *matchers)
        return q.max_by(by, f"last_over_time({s}[{over}])" if over else s)

    return f"({g(mc.JOB_ROWS_DONE)} + {g(mc.JOB_ROWS_FAILED)} + {g(mc.JOB_ROWS_REJECTED)})"


def run_truncated_fraction(by: Sequence[str] = RUN_MODEL, matchers: Iterable[str] = ()) -> str:
    """Truncated share of the run's durably written completions (the job's gauges)."""
    return q.ratio_if_positive(q.max_by(by, q.sel(mc.JOB_ROWS_TRUNCATED.prom_name, *matchers)),
                               q.max_by(by, q.sel(mc.JOB_ROWS_DONE.prom_name, *matchers)))


def truncation_threshold(by: Sequence[str] = RUN_MODEL, matchers: Iterable[str] = ()) -> str:
    """The run's own truncation threshold (job.truncation_alert_ratio)."""
    return q.max_by(by, q.sel(mc.JOB_TRUNCATION_THRESHOLD.prom_name, *matchers))


def healthy_replicas(matchers: Iterable[str] = ()) -> str:
    """Replicas per model whose engine reports up."""
    return q.count_by(("model",), f"({q.sel(mc.ENGINE_UP.prom_name, *matchers)} == 1)")


def expected_replicas(matchers: Iterable[str] = ()) -> str:
    """Replicas the running jobs of a model expect (max over its runs)."""
    running = job_running(matchers=matchers)
    expected = q.max_by(RUN_MODEL, q.sel(mc.JOB_EXPECTED_REPLICAS.prom_name, *matchers))
    return q.max_by(("model",), q.and_on(RUN_MODEL, expected, running))
