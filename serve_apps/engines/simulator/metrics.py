"""Prometheus exposition of the simulated engine, with SGLang's metric names.

Design decisions:
- A dedicated CollectorRegistry (never the global one), so several simulators
  or tests in one process cannot collide and the default process/GC metrics
  do not pollute what the dashboards see.
- One custom collector reads the scheduler's counters at scrape time instead
  of mirroring every change into Gauge/Counter objects: the values exist in
  one place only. CounterMetricFamily("sglang:generation_tokens") exports
  "sglang:generation_tokens_total", exactly as a prometheus_client Counter.
- Every sample carries a model_name label, as SGLang's do.
- sglang:sim_capacity_tok_s is simulator-only: max_decode_tok_s per wall
  second; 0 in zero-latency mode (capacity is unbounded there).
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry
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


class SimulatorCollector(Collector):
    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats]) -> None:
        self._model_name = model_name
        self._stats = stats

    def describe(self) -> Iterable[Metric]:
        # Without describe(), registering would call collect() outside the event loop.
        for name, doc, _ in GAUGES:
            yield GaugeMetricFamily(name, doc, labels=["model_name"])
        for name, doc, _ in COUNTERS:
            yield CounterMetricFamily(name, doc, labels=["model_name"])

    def collect(self) -> Iterable[Metric]:
        s = self._stats()
        for name, doc, attr in GAUGES:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric([self._model_name], float(getattr(s, attr)))
            yield g
        for name, doc, attr in COUNTERS:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric([self._model_name], float(getattr(s, attr)))
            yield c


def build_registry(model_name: str, stats: Callable[[], SchedulerStats]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SimulatorCollector(model_name, stats))
    return registry
