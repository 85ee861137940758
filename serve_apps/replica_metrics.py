"""Replica-side metrics through Ray's metrics API (exported as ``ray_raygen_*``).

Counters, not rates: Prometheus derives tok/s and the truncated fraction. Speculative
accept length is exported as two counters (spec output tokens, verify steps) so any
window's accept length is sum(tokens)/sum(verify), never a mean of ratios.
The engine's own /metrics is relayed sample by sample (see ``EngineRelay``) so SGLang's
metrics reach Prometheus with this replica's labels. Names come from
dashboards/metrics_catalog.py (documented in dashboards/METRICS.md).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from ray.serve import metrics

from contract.protocol import GenerateRequest, GenerateResult
from dashboards import metrics_catalog as mc
from serve_apps import engine_clock

logger = logging.getLogger(__name__)

LATENCY_BOUNDARIES_S = [1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400, 3600]
ACCEPT_BOUNDARIES = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0]


def _counter(m: mc.Metric) -> metrics.Counter:
    return metrics.Counter(m.name, m.description, tag_keys=m.labels)


def _gauge(m: mc.Metric) -> metrics.Gauge:
    return metrics.Gauge(m.name, m.description, tag_keys=m.labels)


def _histogram(m: mc.Metric, boundaries: list[float]) -> metrics.Histogram:
    return metrics.Histogram(m.name, m.description, boundaries=boundaries, tag_keys=m.labels)


class EngineRelay:
    """Forward every ``sglang:*`` sample of the engine's /metrics as a Ray gauge.

    A gauge carrying the engine's own value (cumulative for counters and histogram
    buckets) keeps SGLang's exact series: every sample goes out as
    ``relay_sglang_<x>``, which the scrape config renames ``ray_relay_sglang_<x>`` ->
    ``sglang:<x>``; the samples of the families Ray's Serve LLM SGLang dashboard reads
    also go out as ``sglang_<x>`` (exported ``ray_sglang_<x>``, Ray's own name for
    them). rate()/histogram_quantile() work on both as on the engine's own endpoint.
    One Ray gauge per Ray name, its tag keys fixed by the first sample seen; a later
    sample with other label names is skipped (logged once) because Ray rejects
    undeclared tag keys.
    """

    def __init__(self, watched: tuple[str, ...] = ()) -> None:
        self.gauges: dict[str, tuple[metrics.Gauge, tuple[str, ...]]] = {}
        self._warned: set[str] = set()
        self.watched = frozenset(watched)  # sample names whose last values are kept
        self.values: dict[str, float] = {}  # of the last page, summed over label sets

    def relay(self, metrics_text: str) -> int:
        """Set the gauges of every engine sample; returns how many samples were relayed."""
        relayed, values = 0, {}
        for family in text_string_to_metric_families(metrics_text):
            # A counter's family is named without _total when its TYPE line names it
            # with _total (SGLang's page), with it when the page has no TYPE line.
            for_ray = family.name.removesuffix("_total") in mc.RAY_DASHBOARD_SGLANG_FAMILIES
            for sample in family.samples:
                if not sample.name.startswith(mc.SGLANG_PREFIX):
                    continue
                if sample.name in self.watched:
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
                if self._set(mc.relay_name(sample.name), sample):
                    relayed += 1
                    if for_ray:  # same labels as the gauge just set, so it cannot be refused
                        self._set(mc.ray_dashboard_name(sample.name), sample)
        self.values = values
        return relayed

    def _set(self, gauge_name: str, sample: Any) -> bool:
        keys = tuple(sorted(sample.labels))
        if gauge_name not in self.gauges:
            gauge = metrics.Gauge(gauge_name, f"Relayed from the engine: {sample.name}.", tag_keys=keys)
            self.gauges[gauge_name] = (gauge, keys)
        gauge, declared = self.gauges[gauge_name]
        if keys != declared:
            if gauge_name not in self._warned:
                self._warned.add(gauge_name)
                logger.warning("engine metric %s: labels %s differ from %s; not relayed", sample.name, keys, declared)
            return False
        gauge.set(sample.value, dict(sample.labels))
        return True


class ReplicaMetrics:
    def __init__(self, model: str):
        self.model = model
        self.output_tokens = _counter(mc.OUTPUT_TOKENS)
        self.prompt_tokens = _counter(mc.PROMPT_TOKENS)
        self.completions = _counter(mc.COMPLETIONS)
        self.spec_output_tokens = _counter(mc.SPEC_OUTPUT_TOKENS)
        self.spec_verify_steps = _counter(mc.SPEC_VERIFY_STEPS)
        self.accept_length = _histogram(mc.ACCEPT_LENGTH, ACCEPT_BOUNDARIES)
        self.latency = _histogram(mc.REQUEST_LATENCY, LATENCY_BOUNDARIES_S)
        self.inflight = _gauge(mc.INFLIGHT_REQUESTS)
        self.engine_up = _gauge(mc.ENGINE_UP)
        # The values the engine clock publishes (serve_apps/engine_clock.py).
        self.engine = EngineRelay((engine_clock.IDLE_COUNTER, *engine_clock.WORK_GAUGES))

    def record(self, request: GenerateRequest, result: GenerateResult) -> None:
        if result.error_class:
            return  # failures are counted by the job, which knows about retries
        # The job caps category values (jobs.pipeline.category_cap.CategoryCap) before sending.
        tags = {"model": self.model, "run": request.run or "",
                "category": request.category or ""}
        _inc(self.output_tokens, result.completion_tokens, tags)
        _inc(self.prompt_tokens, result.prompt_tokens, tags)
        self.completions.inc(1, dict(tags, finish_reason=result.finish_reason))
        run_tags = {"model": self.model, "run": tags["run"]}
        self.latency.observe(result.latency_s, run_tags)
        if result.spec_verify_ct:
            _inc(self.spec_output_tokens, result.completion_tokens, run_tags)
            self.spec_verify_steps.inc(result.spec_verify_ct, run_tags)
            self.accept_length.observe(result.accept_length, run_tags)

    def set_inflight(self, n: int) -> None:
        self.inflight.set(n, {"model": self.model})

    def relay_engine(self, metrics_text: str, up: bool) -> None:
        self.engine_up.set(1 if up else 0, {"model": self.model})
        self.engine.relay(metrics_text)


def _inc(counter: metrics.Counter, value: Any, tags: dict[str, str]) -> None:
    if value:  # Ray counters reject 0
        counter.inc(value, tags)
