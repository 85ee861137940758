"""Job-level metrics set by the driver from what is durably written: progress gauges,
the run's alert settings as gauges, the failure/retry/reject counters; plus the link
to raygen's Grafana dashboard the driver logs. Names come from
dashboards/metrics_catalog.py. (The generate actors' cap on the ``category`` label is
jobs/pipeline/category_cap.py.)"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any, Optional

from dashboards import DASHBOARD_UID, metrics_catalog as mc

# Progress gauge -> field of the ProgressTracker snapshot.
GAUGES = {
    mc.JOB_INPUT_ROWS: "total",
    mc.JOB_ROWS_DONE: "completed",
    mc.JOB_ROWS_FAILED: "failed",
    mc.JOB_ROWS_REJECTED: "rejected",
    mc.JOB_ROWS_TRUNCATED: "truncated",
    mc.JOB_OUTPUT_TOKENS_WRITTEN: "output_tokens",
    mc.JOB_ETA_SECONDS: "eta_s",
    mc.JOB_LAST_WRITE_TIMESTAMP: "last_write_at",
    mc.JOB_S3_RETRIES: "s3_retries",
}
OUTCOMES = {"failures": mc.FAILURES, "retries": mc.RETRIES, "rejects": mc.REJECTS}


class JobGauges:
    """The driver's metrics. ``settings`` are per-run constants the alert rules compare
    against (truncation threshold, expected replicas); they are re-set with every
    snapshot because Ray drops a gauge ~20 s after its last set()."""

    def __init__(self, run: str, model: str, truncation_threshold: float, expected_replicas: int):
        from ray.util import metrics  # the driver only; keeps this module importable without ray

        self.tags = {"run": run, "model": model}
        self.gauges = {m: metrics.Gauge(m.name, m.description, tag_keys=m.labels) for m in GAUGES}
        self.running = metrics.Gauge(mc.JOB_RUNNING.name, mc.JOB_RUNNING.description,
                                     tag_keys=mc.JOB_RUNNING.labels)
        self.settings = {
            metrics.Gauge(m.name, m.description, tag_keys=m.labels): float(value)
            for m, value in ((mc.JOB_TRUNCATION_THRESHOLD, truncation_threshold),
                             (mc.JOB_EXPECTED_REPLICAS, expected_replicas))}
        self.outcomes = {key: (m.labels[-1], metrics.Counter(m.name, m.description, tag_keys=m.labels))
                         for key, m in OUTCOMES.items()}

    @classmethod
    def for_config(cls, cfg) -> "JobGauges":
        return cls(cfg.job.run_name, cfg.engine.model_name, cfg.job.truncation_alert_ratio,
                   cfg.serve.autoscaling.min_replicas)

    def count(self, events: list[tuple[str, str]]) -> None:
        """Outcomes read from newly written files (see run_index.RunIndex.events)."""
        for metric, label in events:
            key, counter = self.outcomes[metric]
            counter.inc(1, dict(self.tags, **{key: label}))

    def set(self, snapshot: dict[str, Any]) -> None:
        for m, field in GAUGES.items():
            value = snapshot.get(field)
            if value is not None:
                self.gauges[m].set(float(value), self.tags)
        self.running.set(1.0 if snapshot.get("status") == "running" else 0.0, self.tags)
        for gauge, value in self.settings.items():
            gauge.set(value, self.tags)


def dashboard_url(run: str, model: str, environ: Optional[dict] = None) -> Optional[str]:
    """Link to raygen's Grafana dashboard filtered to this run, or None without Grafana.

    Uses the address the browser reaches Grafana at (Ray's RAY_GRAFANA_IFRAME_HOST,
    else RAY_GRAFANA_HOST), the same variables the Ray dashboard reads.
    """
    env = os.environ if environ is None else environ
    host = env.get("RAY_GRAFANA_IFRAME_HOST") or env.get("RAY_GRAFANA_HOST")
    if not host or host == "DISABLED":
        return None
    query = urllib.parse.urlencode({"orgId": env.get("RAY_GRAFANA_ORG_ID", "1"),
                                    "var-run": run, "var-model": model})
    return f"{host.rstrip('/')}/d/{DASHBOARD_UID}?{query}"
