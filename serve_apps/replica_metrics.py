"""Replica-side metrics through Ray's metrics API (exported as ``ray_raygen_*``).

Counters, not rates: Prometheus derives tok/s and the truncated fraction. Speculative
accept length is exported as two counters (spec output tokens, verify steps) so any
window's accept length is sum(tokens)/sum(verify), never a mean of ratios.
The engine's own gauges are relayed from its /metrics so per-replica engine state is
on the Ray dashboard next to ours. Names are catalogued in dashboards/METRICS.md.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from ray.serve import metrics

_ROW = ("model", "run", "category")
# SGLang gauge name -> our relayed gauge name.
ENGINE_GAUGES = {
    "sglang:num_running_reqs": "raygen_engine_running_requests",
    "sglang:num_queue_reqs": "raygen_engine_queued_requests",
    "sglang:token_usage": "raygen_engine_token_usage",
    "sglang:gen_throughput": "raygen_engine_gen_throughput_tok_s",
    "sglang:spec_accept_length": "raygen_engine_spec_accept_length",
}
LATENCY_BOUNDARIES_S = [1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400, 3600]
ACCEPT_BOUNDARIES = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0]


class ReplicaMetrics:
    def __init__(self, model: str):
        self.model = model
        self.output_tokens = metrics.Counter(
            "raygen_output_tokens", "Completion tokens generated.", tag_keys=_ROW)
        self.prompt_tokens = metrics.Counter(
            "raygen_prompt_tokens", "Prompt tokens processed.", tag_keys=_ROW)
        self.completions = metrics.Counter(
            "raygen_completions", "Finished generations by finish reason.",
            tag_keys=_ROW + ("finish_reason",))
        self.spec_output_tokens = metrics.Counter(
            "raygen_spec_output_tokens",
            "Completion tokens of requests that reported speculative verify steps.",
            tag_keys=("model", "run"))
        self.spec_verify_steps = metrics.Counter(
            "raygen_spec_verify_steps", "Speculative verify steps.", tag_keys=("model", "run"))
        self.accept_length = metrics.Histogram(
            "raygen_accept_length", "Per-request speculative accept length.",
            boundaries=ACCEPT_BOUNDARIES, tag_keys=("model", "run"))
        self.latency = metrics.Histogram(
            "raygen_request_latency_s", "Seconds per generation request in the replica.",
            boundaries=LATENCY_BOUNDARIES_S, tag_keys=("model", "run"))
        self.inflight = metrics.Gauge(
            "raygen_inflight_requests", "Requests in this replica now.", tag_keys=("model",))
        self.engine_up = metrics.Gauge(
            "raygen_engine_up", "1 if the engine answers /health, else 0.", tag_keys=("model",))
        self.engine = {
            ours: metrics.Gauge(ours, f"Relayed engine gauge {theirs}.", tag_keys=("model",))
            for theirs, ours in ENGINE_GAUGES.items()}

    def record(self, request: dict[str, Any], result: dict[str, Any]) -> None:
        if result.get("error_class"):
            return  # failures are counted by the job, which knows about retries
        tags = {"model": self.model, "run": request.get("run") or "",
                "category": request.get("category") or ""}
        _inc(self.output_tokens, result["completion_tokens"], tags)
        _inc(self.prompt_tokens, result["prompt_tokens"], tags)
        self.completions.inc(1, dict(tags, finish_reason=result["finish_reason"]))
        run_tags = {"model": self.model, "run": tags["run"]}
        self.latency.observe(result["latency_s"], run_tags)
        if result.get("spec_verify_ct"):
            _inc(self.spec_output_tokens, result["completion_tokens"], run_tags)
            self.spec_verify_steps.inc(result["spec_verify_ct"], run_tags)
            self.accept_length.observe(result["accept_length"], run_tags)

    def set_inflight(self, n: int) -> None:
        self.inflight.set(n, {"model": self.model})

    def relay_engine(self, metrics_text: str, up: bool) -> None:
        self.engine_up.set(1 if up else 0, {"model": self.model})
        for family in text_string_to_metric_families(metrics_text):
            ours = ENGINE_GAUGES.get(family.name)
            if ours and family.samples:
                value = sum(s.value for s in family.samples)
                self.engine[ours].set(value, {"model": self.model})


def _inc(counter: metrics.Counter, value: Any, tags: dict[str, str]) -> None:
    if value:  # Ray counters reject 0
        counter.inc(value, tags)
