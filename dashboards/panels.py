"""The raygen dashboard: what a person watching a 30-hour run needs, top-down:
is it progressing -> how fast -> is the output good -> is it healthy."""

from __future__ import annotations

from typing import Dict, Tuple

from dashboards import DASHBOARD_UID
from dashboards import grafana as g
from dashboards import metrics_catalog as mc
from dashboards import promql as q
from dashboards import signals as s
from dashboards import thresholds as t
from dashboards.grafana import Panel, Row, Target

UID = DASHBOARD_UID
TITLE = "raygen - generation run"
RI = "$__rate_interval"  # Grafana picks a window >= 4 scrape intervals
RM = q.RUN_MODEL  # run=~"$run", model=~"$model"
M = q.MODEL  # engine/replica gauges carry only model
# SGLang's own series (relayed, see metrics_catalog.SGLANG_SERIES) carry SGLang's
# model_name (the served model name, which may differ from raygen's model label) and
# Serve's replica label: shown per replica, unfiltered.
BY_RUN = ("run", "model")

_UP_DOWN = [{"type": "value", "options": {
    "0": {"text": "DOWN", "color": "red", "index": 0},
    "1": {"text": "UP", "color": "green", "index": 1},
}}]
_RUNNING = [{"type": "value", "options": {
    "0": {"text": "stopped", "color": "blue", "index": 0},
    "1": {"text": "running", "color": "green", "index": 1},
}}]


def _job(metric: mc.Metric) -> str:
    # max, not sum: a restarted driver briefly overlaps with its predecessor's series.
    return q.max_by(BY_RUN, q.sel(metric.prom_name, *RM))


def _by_rate(metric: mc.Metric, label: str, matchers=RM) -> str:
    return q.sum_rate(metric.prom_name, RI, (label,), matchers)


def _quantile(metric: mc.Metric, qv: float) -> Target:
    return Target(q.histogram_quantile(qv, metric.prom_name, RI, ("model",), RM), f"p{int(qv * 100)} {{{{model}}}}")


PROGRESS = Row("Run progress", [
    Panel("Progress", [Target(f"{s.rows_finished(BY_RUN, RM)} / {_job(mc.JOB_INPUT_ROWS)}", "{{run}}")],
          kind="stat", unit="percentunit", width=4,
          description="(done + failed + rejected) / total rows, from what the driver has durably written."),
    Panel("Rows done / total", [
        Target(_job(mc.JOB_ROWS_DONE), "done {{run}}"),
        Target(_job(mc.JOB_INPUT_ROWS), "total {{run}}"),
        Target(_job(mc.JOB_ROWS_FAILED), "failed {{run}}"),
        Target(_job(mc.JOB_ROWS_REJECTED), "rejected {{run}}"),
    ], kind="stat", width=6),
    Panel("Output tokens written", [Target(_job(mc.JOB_OUTPUT_TOKENS_WRITTEN), "{{run}}")], kind="stat", width=4),
    Panel("ETA", [Target(_job(mc.JOB_ETA_SECONDS), "{{run}}")], kind="stat", unit="dtdurations", width=5),
    Panel("Driver running", [Target(_job(mc.JOB_RUNNING), "{{run}}")], kind="stat", width=5,
          mappings=_RUNNING, key="driver_running",
          description="No value while a run should be going = the driver died (RaygenJobDriverGone)."),
    Panel("Time since last durable write", [Target(s.seconds_since_last_write(BY_RUN, RM), "{{run}}")],
          unit="s", min=0, threshold=t.STALL_SECONDS, key="stall",
          description=f"RaygenRunStalled fires above the line ({t.STALL_SECONDS // 60}m) while the driver runs."),
    Panel("Rows written", [
        Target(_job(mc.JOB_ROWS_DONE), "done {{run}}"),
        Target(_job(mc.JOB_ROWS_FAILED), "failed {{run}}"),
        Target(_job(mc.JOB_ROWS_REJECTED), "rejected {{run}}"),
        Target(_job(mc.JOB_ROWS_TRUNCATED), "truncated {{run}}"),
        Target(_job(mc.JOB_INPUT_ROWS), "total {{run}}"),
    ]),
])

THROUGHPUT = Row("Throughput", [
    Panel("Output tokens/s", [
        Target(s.output_tps(RI, BY_RUN, RM), "{{run}} {{model}}"),
        Target(s.output_tps(t.THROUGHPUT_SHORT_WINDOW, BY_RUN, RM), f"{{{{run}}}} {t.THROUGHPUT_SHORT_WINDOW} avg"),
        Target(f"{t.THROUGHPUT_DROP_RATIO:g} * {s.output_tps(t.THROUGHPUT_LONG_WINDOW, BY_RUN, RM)}",
               f"{{{{run}}}} alert floor ({t.THROUGHPUT_DROP_RATIO:.0%} of {t.THROUGHPUT_LONG_WINDOW} avg)"),
    ], unit="short", min=0, key="output_tps",
          description="RaygenThroughputDrop fires when the 10m average stays under the alert floor."),
    Panel("Output tokens/s per replica", [Target(_by_rate(mc.OUTPUT_TOKENS, "replica"), "{{replica}}")],
          min=0, stack=True),
    Panel("Prompt tokens/s", [Target(q.sum_rate(mc.PROMPT_TOKENS.prom_name, RI, BY_RUN, RM), "{{run}} {{model}}")],
          min=0),
    Panel("Engine generation throughput (engine-reported)", [
        Target(q.sum_by(("replica",), "sglang:gen_throughput"), "{{replica}}")],
          min=0, stack=True, description="sglang:gen_throughput, tokens/s, per replica."),
])

QUALITY = Row("Output quality", [
    Panel("Truncated fraction", [
        Target(s.truncated_fraction(t.TRUNCATION_WINDOW, BY_RUN, RM), f"{{{{run}}}} last {t.TRUNCATION_WINDOW}"),
        Target(s.run_truncated_fraction(BY_RUN, RM), "{{run}} whole run (written)"),
        Target(s.truncation_threshold(BY_RUN, RM), "{{run}} alert threshold"),
    ], unit="percentunit", min=0, key="truncated_fraction",
          description="Share of completions with finish_reason=length. RaygenTruncationHigh (warning) fires "
                      "when the whole-run line stays above the run's threshold (job.truncation_alert_ratio) "
                      f"for {t.TRUNCATION_FOR}."),
    Panel("Finish reasons", [Target(_by_rate(mc.COMPLETIONS, "finish_reason"), "{{finish_reason}}")],
          unit="short", min=0, stack=True, description="Completions per second by finish_reason."),
    Panel("Accept length (speculative decoding)", [
        Target(s.accept_length(t.ACCEPT_LENGTH_SHORT_WINDOW, BY_RUN, RM),
               f"{{{{run}}}} {t.ACCEPT_LENGTH_SHORT_WINDOW}"),
        Target(f"{t.ACCEPT_LENGTH_DROP_RATIO:g} * {s.accept_length(t.ACCEPT_LENGTH_LONG_WINDOW, BY_RUN, RM)}",
               f"{{{{run}}}} alert floor ({t.ACCEPT_LENGTH_DROP_RATIO:.0%} of {t.ACCEPT_LENGTH_LONG_WINDOW} avg)"),
        Target(q.avg_by(("model_name",), "sglang:spec_accept_length"), "engine-reported {{model_name}}"),
    ], min=0, key="accept_length",
          description="rate(spec output tokens) / rate(verify steps); only requests with speculative decoding."),
    Panel("Accept length per request p50 / p90", [_quantile(mc.ACCEPT_LENGTH, 0.5), _quantile(mc.ACCEPT_LENGTH, 0.9)],
          min=0),
])

LOAD = Row("Latency and load", [
    Panel("Request latency p50 / p90 / p99", [_quantile(mc.REQUEST_LATENCY, v) for v in (0.5, 0.9, 0.99)],
          unit="s", min=0),
    Panel("In-flight requests per replica", [
        Target(q.sum_by(("replica",), q.sel(mc.INFLIGHT_REQUESTS.prom_name, *M)), "{{replica}}")], min=0),
    Panel("Engine running / queued per replica", [
        Target(q.sum_by(("replica",), "sglang:num_running_reqs"), "running {{replica}}"),
        Target(q.sum_by(("replica",), "sglang:num_queue_reqs"), "queued {{replica}}"),
    ], min=0),
    Panel("Engine KV token usage", [
        Target(q.max_by(("replica",), "sglang:token_usage"), "{{replica}}")],
          unit="percentunit", min=0, max=1),
])


def _sglang_quantile(family: str, qv: float) -> Target:
    buckets = q.sum_by(("le",), q.rate(f"{family}_bucket", RI))
    return Target(f"histogram_quantile({qv}, {buckets})", f"p{int(qv * 100)}")


ENGINE = Row("Engine (SGLang's own metrics, relayed per replica)", [
    Panel("Time to first token", [_sglang_quantile("sglang:time_to_first_token_seconds", v) for v in (0.5, 0.9, 0.99)],
          unit="s", min=0, width=6, description="sglang:time_to_first_token_seconds, all replicas."),
    Panel("Inter-token latency", [_sglang_quantile("sglang:inter_token_latency_seconds", v) for v in (0.5, 0.9, 0.99)],
          unit="s", min=0, width=6, description="sglang:inter_token_latency_seconds, all replicas."),
    Panel("Prefix cache hit rate", [Target(q.max_by(("replica",), "sglang:cache_hit_rate"), "{{replica}}")],
          unit="percentunit", min=0, max=1, width=6, description="sglang:cache_hit_rate per replica."),
    Panel("Retracted requests", [Target(q.max_by(("replica",), "sglang:num_retracted_reqs"), "{{replica}}")],
          min=0, width=6, description="sglang:num_retracted_reqs per replica: requests evicted from the running "
                                      "batch for lack of KV cache (they are recomputed; many = KV pressure)."),
])

ERRORS = Row("Errors", [
    Panel(f"Failure ratio ({t.FAILURE_WINDOW})", [Target(s.failure_ratio(t.FAILURE_WINDOW, ("run",), RM), "{{run}}")],
          unit="percentunit", min=0, threshold=t.FAILURE_RATIO_MAX, key="failure_ratio",
          description="failures / (completions + failures); RaygenFailureRateHigh fires above the line."),
    Panel("Failures by class", [Target(_by_rate(mc.FAILURES, "error_class"), "{{error_class}}")],
          min=0, stack=True),
    Panel("Retries by class", [Target(_by_rate(mc.RETRIES, "error_class"), "{{error_class}}")], min=0, stack=True),
    Panel("Rejects by reason", [Target(_by_rate(mc.REJECTS, "reason"), "{{reason}}")], min=0, stack=True),
])

HEALTH = Row("Engine health", [
    Panel("Engine up", [Target(q.min_by(("model", "replica"), q.sel(mc.ENGINE_UP.prom_name, *M)),
                               "{{replica}}")],
          kind="stat", width=16, threshold=1, threshold_below=True, mappings=_UP_DOWN, key="engine_up",
          description="Per replica. A replica missing here while the job runs is also RaygenEngineDown."),
    Panel("Healthy / expected replicas", [
        Target(s.healthy_replicas(M), "healthy {{model}}"),
        # Not gated on job_running like the alert: the value stays visible after a run.
        Target(q.max_by(("model",), q.sel(mc.JOB_EXPECTED_REPLICAS.prom_name, *RM)), "expected {{model}}"),
    ], kind="stat", width=8, key="replicas",
          description="Replicas whose engine is up vs serve.autoscaling.min_replicas of the running job; "
                      "RaygenReplicasBelowExpected fires while healthy < expected."),
])

ROWS = [PROGRESS, THROUGHPUT, QUALITY, LOAD, ENGINE, ERRORS, HEALTH]

VARIABLES = [
    g.datasource_variable(),
    g.query_variable("run", "Run", f"label_values({mc.JOB_RUNNING.prom_name}, run)"),
    g.query_variable("model", "Model", f'label_values({mc.JOB_RUNNING.prom_name}{{run=~"$run"}}, model)'),
]


def build() -> Tuple[dict, Dict[str, int]]:
    """The dashboard JSON and ``{panel key: panel id}`` (for alert links)."""
    return g.dashboard(
        TITLE, UID, ROWS, VARIABLES, tags=("raygen", "ray"),
        description="raygen generation run: progress, throughput, truncation, accept length, errors, engine health. "
                    "Generated by `python -m dashboards.build`; do not edit by hand.",
    )
