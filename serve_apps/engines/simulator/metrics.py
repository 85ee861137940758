"""Prometheus exposition of the simulated engine, with SGLang's metric names.

Design decisions:
- A dedicated CollectorRegistry (never the global one), so several simulators
  or tests in one process cannot collide and the default process/GC metrics
  do not pollute what the dashboards see.
- One custom collector reads the scheduler's counters at scrape time instead
  of mirroring every change into Gauge/Counter objects: the values exist in
  one place only. CounterMetricFamily("sglang:generation_tokens") exports
  "sglang:generation_tokens_total", exactly as a prometheus_client Counter.
- Every sample carries the labels SGLang 0.5.23's engine gives it (seen on the real
  engine: tests/integration/sglang/test_differential.py): scheduler gauges
  model_name, engine_type and the tp/pp/moe-ep ranks (num_retracted_reqs also the
  scheduler's pid); request counters and the TTFT histogram model_name, engine_type and
  is_streaming; the inter-token latency histogram model_name and engine_type.
- sglang:sim_capacity_tok_s is simulator-only: max_decode_tok_s per wall
  second; 0 in zero-latency mode (capacity is unbounded there).
- RequestMetrics: SGLang's per-request series raygen's dashboard reads. TTFT is
  exact (end of simulated prefill); inter-token latency is observed once per
  request as its mean decode interval (SGLang observes each interval);
  cache_hit_rate is cumulative since start; num_retracted_reqs is the count of
  the scheduler's latest retraction, num_retracted_requests_total all of them since start
  (both 0 without a KV pool: max_total_tokens).
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from serve_apps.engines.simulator.scheduler import SchedulerStats

GAUGES = (
    ("sglang:num_running_reqs", "The number of running requests.", "running"),
    ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", "queued"),
    ("sglang:gen_throughput", "The generation throughput (token/s), recent wall-clock window.", "gen_throughput_tok_s"),
    ("sglang:token_usage", "The token usage of running requests over the KV pool.", "token_usage"),
    ("sglang:spec_accept_length", "The average speculative accept length of recent requests (0 when off).", "spec_accept_length"),
    ("sglang:sim_capacity_tok_s", "Simulator: aggregate decode capacity per wall second (0 = unbounded, zero-latency).", "capacity_tok_s"),
)
COUNTERS = (
    ("sglang:generation_tokens", "Number of generation tokens processed.", "generation_tokens_total"),
    ("sglang:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens_total"),
    ("sglang:num_requests", "Number of requests processed.", "requests_total"),
)
# SGLang 0.5.23 labels these scheduler counters as its gauges (model_name, engine_type, ranks).
SCHEDULER_COUNTERS = (
    ("sglang:scheduler_idle_seconds", "Total wall time while the scheduler has no runnable or queued work.",
     "idle_seconds_total"),
    ("sglang:num_retracted_requests", "Total number of retracted requests.", "retractions_total"),
)
# Counters SGLang's engine writes only from their first increment (seen on the real engine).
LAZY = frozenset({"retractions_total"})


# Label values of a single-GPU engine (no tensor/pipeline/expert parallelism), not streamed.
SCHEDULER_LABELS = {"engine_type": "unified", "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
REQUEST_LABELS = {"engine_type": "unified", "is_streaming": "false"}


def _labels(model_name: str, extra: dict[str, str]) -> dict[str, str]:
    return dict(sorted({"model_name": model_name, **extra}.items()))


class SimulatorCollector(Collector):
    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats]) -> None:
        self._gauge_labels = _labels(model_name, SCHEDULER_LABELS)
        self._counter_labels = _labels(model_name, REQUEST_LABELS)
        self._stats = stats

    def describe(self) -> Iterable[Metric]:
        # Without describe(), registering would call collect() outside the event loop.
        for name, doc, _ in GAUGES:
            yield GaugeMetricFamily(name, doc, labels=list(self._gauge_labels))
        for name, doc, _ in COUNTERS:
            yield CounterMetricFamily(name, doc, labels=list(self._counter_labels))
        for name, doc, _ in SCHEDULER_COUNTERS:
            yield CounterMetricFamily(name, doc, labels=list(self._gauge_labels))

    def collect(self) -> Iterable[Metric]:
        s = self._stats()
        for name, doc, attr in GAUGES:
            g = GaugeMetricFamily(name, doc, labels=list(self._gauge_labels))
            g.add_metric(list(self._gauge_labels.values()), float(getattr(s, attr)))
            yield g
        for name, doc, attr in COUNTERS:
            c = CounterMetricFamily(name, doc, labels=list(self._counter_labels))
            c.add_metric(list(self._counter_labels.values()), float(getattr(s, attr)))
            yield c
        for name, doc, attr in SCHEDULER_COUNTERS:
            if attr in LAZY and not getattr(s, attr):
                continue
            c = CounterMetricFamily(name, doc, labels=list(self._gauge_labels))
            c.add_metric(list(self._gauge_labels.values()), float(getattr(s, attr)))
            yield c


def build_registry(model_name: str, stats: Callable[[], SchedulerStats]) -> CollectorRegistry:
    # SGLang's multiprocess collector exports no *_created samples; neither do we (this
    # is the simulator's own process).
    disable_created_metrics()
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SimulatorCollector(model_name, stats))
    return registry


# SGLang's default bucket edges are finer; these cover the simulator's range.
LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RequestMetrics:
    """Per-request SGLang series (names and model_name label as SGLang's)."""

    def __init__(self, model_name: str, registry: CollectorRegistry) -> None:
        def make(cls, name: str, doc: str, labels: dict[str, str], **kw):
            return cls(name, doc, list(labels), registry=registry, **kw).labels(**labels)

        request = _labels(model_name, REQUEST_LABELS)
        scheduler = _labels(model_name, SCHEDULER_LABELS)
        self.ttft = make(Histogram, "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         request, buckets=LATENCY_BUCKETS_S)
        self.itl = make(Histogram, "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        _labels(model_name, {"engine_type": "unified"}), buckets=LATENCY_BUCKETS_S)
        self.cache_hit_rate = make(Gauge, "sglang:cache_hit_rate", "The prefix cache hit rate.", scheduler)
        self.retracted = make(Gauge, "sglang:num_retracted_reqs", "The number of retracted requests.",
                              _labels(model_name, {**SCHEDULER_LABELS, "pid": str(os.getpid())}))
        self.retracted.set(0)
        self._input = self._cached = 0

    def observe(self, arrival: float, first_token_at: float, done: float, input_tokens: int, cached_tokens: int,
                output_tokens: int) -> None:
        self.ttft.observe(max(first_token_at - arrival, 0.0))
        if output_tokens > 1:
            self.itl.observe(max(done - first_token_at, 0.0) / (output_tokens - 1))
        self._input += input_tokens
        self._cached += cached_tokens
        self.cache_hit_rate.set(self._cached / self._input if self._input else 0.0)
