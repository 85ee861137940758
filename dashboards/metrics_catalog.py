"""The raygen metrics contract: every metric the replicas and the job emit.

Emitters (serve_apps/, jobs/) import the *base* names from here and pass them to
``ray.serve.metrics`` / ``ray.util.metrics``; dashboards and alert rules use the
*exported* Prometheus names.  Ray's exporter prefixes ``ray_`` and, for
counters, appends ``_total``; histograms become ``_bucket``/``_sum``/``_count``.

Deliberately import-light (stdlib only, no ray) so the job driver, the replica
code, the dashboard generator and the tests can all import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"

REPLICA = "replica"  # emitted inside a Serve replica (Serve adds deployment/replica/application)
JOB = "job"  # emitted by the Ray Data job driver / its tasks

# Closed set of finish reasons; anything else from the engine is mapped to "abort".
FINISH_REASONS: Tuple[str, ...] = ("stop", "length", "abort")

# Labels Ray itself attaches (not raygen tag_keys, but present on every series;
# observed on Ray 2.60 with the OpenTelemetry exporter).  Prometheus adds
# instance/job.  WorkerId changes when a process restarts, so always aggregate
# with an explicit ``by (...)`` rather than relying on series identity.
RAY_LABELS: Tuple[str, ...] = ("SessionName", "NodeAddress", "Component", "Version", "WorkerId", "otel_scope_name")
SERVE_LABELS: Tuple[str, ...] = ("deployment", "replica", "application")


@dataclass(frozen=True)
class Metric:
    name: str  # base name registered with Ray, e.g. "raygen_output_tokens"
    type: str  # COUNTER | GAUGE | HISTOGRAM
    labels: Tuple[str, ...]  # raygen's own tag_keys (Ray/Serve add more, see above)
    description: str
    source: str  # REPLICA | JOB

    @property
    def prom_name(self) -> str:
        """Name of the exported family as queried in PromQL (counters: *_total)."""
        base = "ray_" + self.name
        return base + "_total" if self.type == COUNTER else base

    @property
    def series_names(self) -> Tuple[str, ...]:
        """Every sample name this metric produces in Prometheus."""
        if self.type == HISTOGRAM:
            return tuple(self.prom_name + s for s in ("_bucket", "_sum", "_count"))
        return (self.prom_name,)


_MR = ("model", "run")
_MRC = ("model", "run", "category")

# --- replica side ---------------------------------------------------------------
OUTPUT_TOKENS = Metric("raygen_output_tokens", COUNTER, _MRC, "Completion tokens generated.", REPLICA)
PROMPT_TOKENS = Metric("raygen_prompt_tokens", COUNTER, _MRC, "Prompt tokens processed.", REPLICA)
COMPLETIONS = Metric(
    "raygen_completions", COUNTER, _MRC + ("finish_reason",),
    "Completions finished, by finish_reason (stop|length|abort); length = truncated.", REPLICA)
SPEC_VERIFY_STEPS = Metric(
    "raygen_spec_verify_steps", COUNTER, _MR,
    "Speculative-decoding verify steps (denominator of accept length).", REPLICA)
SPEC_OUTPUT_TOKENS = Metric(
    "raygen_spec_output_tokens", COUNTER, _MR,
    "Completion tokens of requests that reported verify steps (numerator of accept length).", REPLICA)
ACCEPT_LENGTH = Metric(
    "raygen_accept_length", HISTOGRAM, _MR,
    "Per-request accept length (completion tokens / verify steps).", REPLICA)
REQUEST_LATENCY = Metric(
    "raygen_request_latency_seconds", HISTOGRAM, _MR, "End-to-end request latency in the replica, seconds.", REPLICA)
INFLIGHT_REQUESTS = Metric(
    "raygen_inflight_requests", GAUGE, ("model",), "Requests currently inside the replica.", REPLICA)
ENGINE_UP = Metric(
    "raygen_engine_up", GAUGE, ("model",), "1 while the replica's engine passes health checks, else 0.", REPLICA)

# --- job side -------------------------------------------------------------------
FAILURES = Metric("raygen_failures", COUNTER, ("model", "run", "error_class"),
                  "Rows that failed permanently (after retries), by error class.", JOB)
RETRIES = Metric("raygen_retries", COUNTER, ("model", "run", "error_class"), "Request retries, by error class.", JOB)
REJECTS = Metric("raygen_rejects", COUNTER, ("model", "run", "reason"),
                 "Rows rejected before generation (validation), by reason.", JOB)
ROWS_CHECKED = Metric(
    "raygen_rows_checked", COUNTER, ("model", "run", "engine_replica"),
    "Data rows the integrity guard checked, by the replica that produced them (the flagged "
    "rate's denominator).", JOB)
ROWS_FLAGGED = Metric(
    "raygen_rows_flagged", COUNTER, ("model", "run", "engine_replica", "flag"),
    "Data rows written with an integrity flag (contract/integrity.py), by producing "
    "replica and flag; a row with two flags counts under each.", JOB)
JOB_INPUT_ROWS = Metric("raygen_job_input_rows", GAUGE, _MR, "Rows in the input of the run.", JOB)
JOB_ROWS_DONE = Metric("raygen_job_rows_done", GAUGE, _MR, "Rows durably written with a completion.", JOB)
JOB_ROWS_FAILED = Metric("raygen_job_rows_failed", GAUGE, _MR, "Rows durably written as failed.", JOB)
JOB_ROWS_REJECTED = Metric("raygen_job_rows_rejected", GAUGE, _MR, "Rows durably written as rejected.", JOB)
JOB_ROWS_TRUNCATED = Metric("raygen_job_rows_truncated", GAUGE, _MR,
                            "Rows durably written whose completion hit the length limit.", JOB)
JOB_OUTPUT_TOKENS_WRITTEN = Metric("raygen_job_output_tokens_written", GAUGE, _MR,
                                   "Completion tokens durably written.", JOB)
JOB_ETA_SECONDS = Metric("raygen_job_eta_seconds", GAUGE, _MR, "Driver's estimate of seconds to finish.", JOB)
JOB_LAST_WRITE_TIMESTAMP = Metric(
    "raygen_job_last_write_timestamp_seconds", GAUGE, _MR,
    "Unix time of the newest durable write (initialised to driver start).", JOB)
JOB_S3_RETRIES = Metric(
    "raygen_job_s3_retries", GAUGE, _MR,
    "Store calls this driver's job tried again after a transient S3 error (throttling, "
    "5xx, connection lost; jobs/io/s3_retry.py), all its processes together.", JOB)
JOB_RUNNING = Metric("raygen_job_running", GAUGE, _MR, "1 while the driver runs; set to 0 on clean exit.", JOB)
JOB_TRUNCATION_THRESHOLD = Metric(
    "raygen_job_truncation_threshold_ratio", GAUGE, _MR,
    "The run's truncation alert threshold (job.truncation_alert_ratio), 0..1.", JOB)
JOB_EXPECTED_REPLICAS = Metric(
    "raygen_job_expected_replicas", GAUGE, _MR,
    "Engine replicas the run expects at least (serve.autoscaling.min_replicas).", JOB)

# --- relayed from SGLang ------------------------------------------------------------
# Each replica relays every ``sglang:*`` sample of its engine's /metrics as a Ray gauge
# (value = the engine's own value, counters and histogram buckets included), under two
# names (serve_apps/replica_metrics.py ``EngineRelay``):
# - every sample as ``relay_sglang_<rest>``: Ray exports ``ray_relay_sglang_<rest>``,
#   which the scrape config renames to SGLang's own ``sglang:<rest>``
#   (cluster/prometheus/prometheus.yml, the PodMonitor), what raygen's dashboard, alerts
#   and SGLang's published Grafana dashboard read;
# - the samples of the families Ray's "Serve LLM SGLang" dashboard reads (Ray 2.60,
#   uid rayServeLlmSglangDashboard) also as ``sglang_<rest>``: Ray exports
#   ``ray_sglang_<rest>``, the name Ray gives SGLang's metrics itself, left as is by
#   the scrape config. Only those families: 199 more series per replica where a copy of
#   all would double the engine's ~520 on every node's metrics page.
# Both carry the engine's labels (model_name, ...) and Serve's deployment/replica.
RELAY_PREFIX = "relay_sglang_"   # Ray name of every relayed sample
RAY_SGLANG_PREFIX = "sglang_"    # Ray name of the copy Ray's SGLang dashboard reads
SGLANG_PREFIX = "sglang:"
# The SGLang series raygen's dashboard reads (the relay forwards all of them).
SGLANG_SERIES = frozenset({
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
    "sglang:spec_accept_length", "sglang:cache_hit_rate", "sglang:num_retracted_reqs",
    "sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
})
# SGLang metric families (as the exposition's TYPE lines name them: counters without
# _total) whose samples Ray's Serve LLM SGLang dashboard reads as ray_sglang_*, panels
# and template variables; held equal to the installed Ray's dashboard by
# tests/unit/dashboards/test_ray_sglang_dashboard.py.
RAY_DASHBOARD_SGLANG_FAMILIES = frozenset({
    "sglang:prompt_tokens", "sglang:generation_tokens", "sglang:num_aborted_requests",
    "sglang:token_usage", "sglang:cache_hit_rate",
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_paused_reqs",
    "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds",
    "sglang:prompt_tokens_histogram", "sglang:generation_tokens_histogram",
})


# The scrape-time rename (Prometheus metric_relabel_configs form; PodMonitor uses the
# same fields in camelCase). cluster/ configs must carry exactly this rule (tested).
# It matches only the relay's own names: Ray's ray_sglang_* copy passes unchanged.
SGLANG_RELABEL = {"source_labels": ["__name__"], "regex": "ray_relay_sglang_(.+)",
                  "target_label": "__name__", "replacement": "sglang:$1"}


def relay_name(sglang_sample: str) -> str:
    """Ray metric name for an SGLang sample name (``sglang:x`` -> ``relay_sglang_x``)."""
    return RELAY_PREFIX + sglang_sample.removeprefix(SGLANG_PREFIX)


def ray_dashboard_name(sglang_sample: str) -> str:
    """Ray metric name of the copy Ray's SGLang dashboard reads (``sglang:x`` -> ``sglang_x``,
    exported as ``ray_sglang_x``)."""
    return RAY_SGLANG_PREFIX + sglang_sample.removeprefix(SGLANG_PREFIX)


CATALOG: Tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))
BY_NAME: Dict[str, Metric] = {m.name: m for m in CATALOG}
BY_PROM_NAME: Dict[str, Metric] = {m.prom_name: m for m in CATALOG}
# Every sample name that may legitimately appear in a query.
SERIES_NAMES = frozenset(s for m in CATALOG for s in m.series_names)

assert len(BY_NAME) == len(CATALOG), "duplicate metric name in catalog"
