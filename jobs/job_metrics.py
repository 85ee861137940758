"""Job-level metrics set by the driver from what is durably written: progress gauges
and the failure/retry/reject counters."""

from __future__ import annotations

from typing import Any

from ray.util import metrics

GAUGES = {
    "raygen_job_rows_total": "total",
    "raygen_job_rows_done": "completed",
    "raygen_job_rows_failed": "failed",
    "raygen_job_rows_rejected": "rejected",
    "raygen_job_rows_truncated": "truncated",
    "raygen_job_output_tokens_written": "output_tokens",
    "raygen_job_eta_seconds": "eta_s",
    "raygen_job_last_write_timestamp_seconds": "last_write_at",
}


class JobGauges:
    def __init__(self, run: str, model: str):
        self.tags = {"run": run, "model": model}
        self.gauges = {name: metrics.Gauge(name, f"Job progress: {field}.",
                                           tag_keys=("run", "model"))
                       for name, field in GAUGES.items()}
        self.running = metrics.Gauge("raygen_job_running", "1 while the job driver runs.",
                                     tag_keys=("run", "model"))
        self.outcomes = {
            "failures": ("error_class", metrics.Counter(
                "raygen_failures", "Rows failed after retries.",
                tag_keys=("run", "model", "error_class"))),
            "retries": ("error_class", metrics.Counter(
                "raygen_retries", "Request retries.", tag_keys=("run", "model", "error_class"))),
            "rejects": ("reason", metrics.Counter(
                "raygen_rejects", "Rejected input rows.", tag_keys=("run", "model", "reason"))),
        }

    def count(self, events: list[tuple[str, str]]) -> None:
        """Outcomes read from newly written files (see progress.RunCounts.events)."""
        for metric, label in events:
            key, counter = self.outcomes[metric]
            counter.inc(1, dict(self.tags, **{key: label}))

    def set(self, snapshot: dict[str, Any]) -> None:
        for name, field in GAUGES.items():
            value = snapshot.get(field)
            if value is not None:
                self.gauges[name].set(float(value), self.tags)
        self.running.set(1.0 if snapshot.get("status") == "running" else 0.0, self.tags)
