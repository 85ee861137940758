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
from dashboards.grafana import Row, stat, target as T, timeseries

UID = DASHBOARD_UID
TITLE = "raygen - generation run"
RI = "$__rate_interval"  # Grafana picks a window >= 4 scrape intervals
RM = q.RUN_MODEL  # run=~"$run", model=~"$model"
M = q.MODEL  # engine/replica gauges carry only model
# SGLang's own series (relayed, see metrics_catalog.SGLANG_SERIES) carry SGLang's
# model_name (the served model name, which may differ from raygen's model label) and
# Serve's replica label: shown per replica, unfiltered.
BY_RUN = ("run", "model")

_UP_DOWN = [g.value_map({"0": ("DOWN", "red"), "1": ("UP", "green")})]
_RUNNING = [g.value_map({"0": ("stopped", "blue"), "1": ("running", "green")})]


def _job(metric: mc.Metric) -> str:
    # max, not sum: a restarted driver briefly overlaps with its predecessor's series.
    return q.max_by(BY_RUN, q.sel(metric.prom_name, *RM))


def _by_rate(metric: mc.Metric, label: str, matchers=RM) -> str:
    return q.sum_rate(metric.prom_name, RI, (label,), matchers)


def _quantile(metric: mc.Metric, qv: float):
    return T(q.histogram_quantile(qv, metric.prom_name, RI, ("model",), RM), f"p{int(qv * 100)} {{{{model}}}}")


PROGRESS = Row("Run progress", [
    stat("Progress", T(f"{s.rows_finished(BY_RUN, RM)} / {_job(mc.JOB_INPUT_ROWS)}", "{{run}}"))
    .unit("percentunit").span(4)
    .description("(done + failed + rejected) / total rows, from what the driver has durably written."),
    stat("Rows done / total",
         T(_job(mc.JOB_ROWS_DONE), "done {{run}}"),
         T(_job(mc.JOB_INPUT_ROWS), "total {{run}}"),
         T(_job(mc.JOB_ROWS_FAILED), "failed {{run}}"),
         T(_job(mc.JOB_ROWS_REJECTED), "rejected {{run}}")).span(6),
    stat("Output tokens written", T(_job(mc.JOB_OUTPUT_TOKENS_WRITTEN), "{{run}}")).span(4),
    stat("ETA", T(_job(mc.JOB_ETA_SECONDS), "{{run}}")).unit("dtdurations").span(5),
    stat("Driver running", T(_job(mc.JOB_RUNNING), "{{run}}")).span(5).mappings(_RUNNING).key("driver_running")
    .description("No value while a run should be going = the driver died (RaygenJobDriverGone)."),
    timeseries("Time since last durable write", T(s.seconds_since_last_write(BY_RUN, RM), "{{run}}"))
    .unit("s").min(0).alert_line(t.STALL_SECONDS).key("stall")
    .description(f"RaygenRunStalled fires above the line ({t.STALL_SECONDS // 60}m) while the driver runs."),
    timeseries("Rows written",
               T(_job(mc.JOB_ROWS_DONE), "done {{run}}"),
               T(_job(mc.JOB_ROWS_FAILED), "failed {{run}}"),
               T(_job(mc.JOB_ROWS_REJECTED), "rejected {{run}}"),
               T(_job(mc.JOB_ROWS_TRUNCATED), "truncated {{run}}"),
               T(_job(mc.JOB_INPUT_ROWS), "total {{run}}")),
    timeseries("S3 calls retried", T(_job(mc.JOB_S3_RETRIES), "{{run}}")).min(0)
    .description("Store calls tried again after a transient S3 error (503 SlowDown, 500, a lost "
                 "connection), the job's processes together; a steady climb = a throttled "
                 "prefix or an outage the run is riding out (progress.json s3_retries_by_kind)."),
])

THROUGHPUT = Row("Throughput", [
    timeseries("Output tokens/s",
               T(s.output_tps(RI, BY_RUN, RM), "{{run}} {{model}}"),
               T(s.output_tps(t.THROUGHPUT_SHORT_WINDOW, BY_RUN, RM), f"{{{{run}}}} {t.THROUGHPUT_SHORT_WINDOW} avg"),
               T(f"{t.THROUGHPUT_DROP_RATIO:g} * {s.output_tps(t.THROUGHPUT_LONG_WINDOW, BY_RUN, RM)}",
                 f"{{{{run}}}} alert floor ({t.THROUGHPUT_DROP_RATIO:.0%} of {t.THROUGHPUT_LONG_WINDOW} avg)"))
    .min(0).key("output_tps")
    .description("RaygenThroughputDrop fires when the 10m average stays under the alert floor."),
    timeseries("Output tokens/s per replica", T(_by_rate(mc.OUTPUT_TOKENS, "replica"), "{{replica}}"))
    .min(0).stacked(),
    timeseries("Prompt tokens/s", T(q.sum_rate(mc.PROMPT_TOKENS.prom_name, RI, BY_RUN, RM), "{{run}} {{model}}"))
    .min(0),
    timeseries("Engine generation throughput (engine-reported)",
               T(q.sum_by(("replica",), "sglang:gen_throughput"), "{{replica}}"))
    .min(0).stacked().description("sglang:gen_throughput, tokens/s, per replica."),
])

QUALITY = Row("Output quality", [
    timeseries("Truncated fraction",
               T(s.truncated_fraction(t.TRUNCATION_WINDOW, BY_RUN, RM), f"{{{{run}}}} last {t.TRUNCATION_WINDOW}"),
               T(s.run_truncated_fraction(BY_RUN, RM), "{{run}} whole run (written)"),
               T(s.truncation_threshold(BY_RUN, RM), "{{run}} alert threshold"))
    .unit("percentunit").min(0).key("truncated_fraction")
    .description("Share of completions with finish_reason=length. RaygenTruncationHigh (warning) fires "
                 "when the whole-run line stays above the run's threshold (job.truncation_alert_ratio) "
                 f"for {t.TRUNCATION_FOR}."),
    timeseries("Finish reasons", T(_by_rate(mc.COMPLETIONS, "finish_reason"), "{{finish_reason}}"))
    .min(0).stacked().description("Completions per second by finish_reason."),
    timeseries("Accept length (speculative decoding)",
               T(s.accept_length(t.ACCEPT_LENGTH_SHORT_WINDOW, BY_RUN, RM),
                 f"{{{{run}}}} {t.ACCEPT_LENGTH_SHORT_WINDOW}"),
               T(f"{t.ACCEPT_LENGTH_DROP_RATIO:g} * {s.accept_length(t.ACCEPT_LENGTH_LONG_WINDOW, BY_RUN, RM)}",
                 f"{{{{run}}}} alert floor ({t.ACCEPT_LENGTH_DROP_RATIO:.0%} of {t.ACCEPT_LENGTH_LONG_WINDOW} avg)"),
               T(q.avg_by(("model_name",), "sglang:spec_accept_length"), "engine-reported {{model_name}}"))
    .min(0).key("accept_length")
    .description("rate(spec output tokens) / rate(verify steps); only requests with speculative decoding."),
    timeseries("Accept length per request p50 / p90",
               _quantile(mc.ACCEPT_LENGTH, 0.5), _quantile(mc.ACCEPT_LENGTH, 0.9)).min(0),
])

_FW = t.REPLICA_FLAGGED_WINDOW
_AW = t.REPLICA_ACCEPT_LENGTH_WINDOW

INTEGRITY = Row("Output integrity per replica", [
    timeseries(f"Flagged rate per replica ({_FW})",
               T(s.flagged_rate(_FW, s.ENGINE_REPLICA, RM), "{{engine_replica}}"),
               T(s.flagged_rate(_FW, BY_RUN, RM), "fleet {{run}}"),
               T(f"{t.REPLICA_FLAGGED_FLEET_MULTIPLE:g} * {s.flagged_rate(_FW, BY_RUN, RM)}",
                 f"{{{{run}}}} {t.REPLICA_FLAGGED_FLEET_MULTIPLE:g}x fleet"))
    .unit("percentunit").min(0).span(8).alert_line(t.REPLICA_FLAGGED_RATIO_MIN).key("replica_flagged")
    .description("Integrity flags per row checked (contract/integrity.py; a row with two flags counts "
                 "twice), by the replica that produced the rows. RaygenReplicaOutputsFlagged fires for a "
                 f"replica above both the red line ({t.REPLICA_FLAGGED_RATIO_MIN:.0%}) and "
                 f"{t.REPLICA_FLAGGED_FLEET_MULTIPLE:g}x the rate of the other replicas of its run (the "
                 f"{t.REPLICA_FLAGGED_FLEET_MULTIPLE:g}x fleet line includes the replica itself), with at "
                 f"least {t.REPLICA_FLAGGED_MIN_ROWS} rows checked in {_FW}."),
    timeseries("Flags by kind", T(_by_rate(mc.ROWS_FLAGGED, "flag"), "{{flag}}"))
    .min(0).span(8).stacked()
    .description("Flagged rows per second by flag, all replicas (a row with two flags counts under each). "
                 "One replica's flags only: filter the query by engine_replica."),
    timeseries(f"Accept length per replica ({_AW})",
               T(s.accept_length(_AW, s.SERVE_REPLICA, RM), "{{replica}}"),
               T(f"{t.REPLICA_ACCEPT_LENGTH_RATIO:g} * {s.accept_length(_AW, BY_RUN, RM)}",
                 f"{{{{run}}}} {t.REPLICA_ACCEPT_LENGTH_RATIO:.0%} of fleet"))
    .min(0).span(8).key("replica_accept_length")
    .description("rate(spec output tokens) / rate(verify steps) per replica. RaygenReplicaAcceptLengthLow "
                 f"fires for a replica under {t.REPLICA_ACCEPT_LENGTH_RATIO:.0%} of the other replicas' accept "
                 f"length (the line shows {t.REPLICA_ACCEPT_LENGTH_RATIO:.0%} of the whole fleet's), with at "
                 f"least {t.REPLICA_ACCEPT_LENGTH_MIN_STEPS} verify steps on each side in {_AW}."),
])

LOAD = Row("Latency and load", [
    timeseries("Request latency p50 / p90 / p99", *[_quantile(mc.REQUEST_LATENCY, v) for v in (0.5, 0.9, 0.99)])
    .unit("s").min(0),
    timeseries("In-flight requests per replica",
               T(q.sum_by(("replica",), q.sel(mc.INFLIGHT_REQUESTS.prom_name, *M)), "{{replica}}")).min(0),
    timeseries("Engine running / queued per replica",
               T(q.sum_by(("replica",), "sglang:num_running_reqs"), "running {{replica}}"),
               T(q.sum_by(("replica",), "sglang:num_queue_reqs"), "queued {{replica}}")).min(0),
    timeseries("Engine KV token usage", T(q.max_by(("replica",), "sglang:token_usage"), "{{replica}}"))
    .unit("percentunit").min(0).max(1),
])


def _sglang_quantile(family: str, qv: float):
    buckets = q.sum_by(("le",), q.rate(f"{family}_bucket", RI))
    return T(f"histogram_quantile({qv}, {buckets})", f"p{int(qv * 100)}")


ENGINE = Row("Engine (SGLang's own metrics, relayed per replica)", [
    timeseries("Time to first token",
               *[_sglang_quantile("sglang:time_to_first_token_seconds", v) for v in (0.5, 0.9, 0.99)])
    .unit("s").min(0).span(6).description("sglang:time_to_first_token_seconds, all replicas."),
    timeseries("Inter-token latency",
               *[_sglang_quantile("sglang:inter_token_latency_seconds", v) for v in (0.5, 0.9, 0.99)])
    .unit("s").min(0).span(6).description("sglang:inter_token_latency_seconds, all replicas."),
    timeseries("Prefix cache hit rate", T(q.max_by(("replica",), "sglang:cache_hit_rate"), "{{replica}}"))
    .unit("percentunit").min(0).max(1).span(6).description("sglang:cache_hit_rate per replica."),
    timeseries("Retracted requests", T(q.max_by(("replica",), "sglang:num_retracted_reqs"), "{{replica}}"))
    .min(0).span(6).description("sglang:num_retracted_reqs per replica: requests evicted from the running "
                                "batch for lack of KV cache (they are recomputed; many = KV pressure)."),
])

ERRORS = Row("Errors", [
    timeseries(f"Failure ratio ({t.FAILURE_WINDOW})", T(s.failure_ratio(t.FAILURE_WINDOW, ("run",), RM), "{{run}}"))
    .unit("percentunit").min(0).alert_line(t.FAILURE_RATIO_MAX).key("failure_ratio")
    .description("failures / (completions + failures); RaygenFailureRateHigh fires above the line."),
    timeseries("Failures by class", T(_by_rate(mc.FAILURES, "error_class"), "{{error_class}}")).min(0).stacked(),
    timeseries("Retries by class", T(_by_rate(mc.RETRIES, "error_class"), "{{error_class}}")).min(0).stacked(),
    timeseries("Rejects by reason", T(_by_rate(mc.REJECTS, "reason"), "{{reason}}")).min(0).stacked(),
])

HEALTH = Row("Engine health", [
    stat("Engine up", T(q.min_by(("model", "replica"), q.sel(mc.ENGINE_UP.prom_name, *M)), "{{replica}}"))
    .span(16).red_below(1).mappings(_UP_DOWN).key("engine_up")
    .description("Per replica. A replica missing here while the job runs is also RaygenEngineDown."),
    stat("Healthy / expected replicas",
         T(s.healthy_replicas(M), "healthy {{model}}"),
         # Not gated on job_running like the alert: the value stays visible after a run.
         T(q.max_by(("model",), q.sel(mc.JOB_EXPECTED_REPLICAS.prom_name, *RM)), "expected {{model}}"))
    .span(8).key("replicas")
    .description("Replicas whose engine is up vs serve.autoscaling.min_replicas of the running job; "
                 "RaygenReplicasBelowExpected fires while healthy < expected."),
])

ROWS = [PROGRESS, THROUGHPUT, QUALITY, INTEGRITY, LOAD, ENGINE, ERRORS, HEALTH]

VARIABLES = [
    g.datasource_variable(),
    g.query_variable("run", "Run", f"label_values({mc.JOB_RUNNING.prom_name}, run)"),
    g.query_variable("model", "Model", f'label_values({mc.JOB_RUNNING.prom_name}{{run=~"$run"}}, model)'),
]


def build() -> Tuple[dict, Dict[str, int]]:
    """The dashboard JSON and ``{panel key: panel id}`` (for alert links)."""
    return g.dashboard(
        TITLE, UID, ROWS, VARIABLES, tags=("raygen", "ray"),
        description="raygen generation run: progress, throughput, truncation, accept length, output integrity "
                    "per replica, errors, engine health. "
                    "Generated by `python -m dashboards.build`; do not edit by hand.",
    )
