"""The relay's copy for Ray's "Serve LLM SGLang" dashboard (Ray 2.60, uid
rayServeLlmSglangDashboard), against the dashboard the installed Ray builds: the
families the catalog copies are exactly the ones it reads, and a relayed engine page
comes out of the scrape under every name it reads, SGLang's own names kept beside."""

from __future__ import annotations

import re

from dashboards import metrics_catalog as mc
from tests.support import ray_dashboards as rd
from tests.support.fake_gauges import record_gauges

def _scraped(ray_metric: str) -> str:
    """The name Prometheus stores for a Ray metric: ray_ + name, then the repo's rename
    (anchored regex, $1 as re's \\1)."""
    rule = mc.SGLANG_RELABEL
    return re.sub(rf"^{rule['regex']}$", rule["replacement"].replace("$1", r"\1"), "ray_" + ray_metric)


def _exposition(names: set[str]) -> str:
    """An engine page in SGLang's exposition format with one series of every family
    the given ray_sglang_* names belong to, plus one family Ray's dashboard does not read."""
    lines = []
    for family in sorted({rd.family(n) for n in names}):
        kinds = {n.removeprefix("ray_" + mc.RAY_SGLANG_PREFIX + family.removeprefix(mc.SGLANG_PREFIX))
                 for n in names if rd.family(n) == family}
        if "_bucket" in kinds:
            lines += [f"# TYPE {family} histogram",
                      f'{family}_bucket{{le="1.0",model_name="m"}} 2.0',
                      f'{family}_bucket{{le="+Inf",model_name="m"}} 3.0',
                      f'{family}_sum{{model_name="m"}} 1.5', f'{family}_count{{model_name="m"}} 3.0']
        elif kinds == {"_total"}:
            lines += [f"# TYPE {family}_total counter", f'{family}_total{{model_name="m"}} 7.0']  # as SGLang writes it
        else:
            lines += [f"# TYPE {family} gauge", f'{family}{{model_name="m"}} 0.25']
    lines += ["# TYPE sglang:gen_throughput gauge", 'sglang:gen_throughput{model_name="m"} 9.0']
    return "\n".join(lines) + "\n"


def test_catalog_copies_exactly_the_families_rays_sglang_dashboard_reads():
    names = rd.ray_names(rd.sglang_dashboard())
    # Throughput, latency, cache, request length and scheduler rows, and the model variable.
    assert {"ray_sglang_prompt_tokens_total", "ray_sglang_generation_tokens_total",
            "ray_sglang_token_usage", "ray_sglang_time_to_first_token_seconds_bucket"} <= names, names
    assert {rd.family(n) for n in names} == mc.RAY_DASHBOARD_SGLANG_FAMILIES, \
        "Ray's SGLang dashboard reads other families: update metrics_catalog.RAY_DASHBOARD_SGLANG_FAMILIES"


def test_a_relayed_engine_page_is_scraped_under_rays_names_and_sglangs(monkeypatch):
    from serve_apps import replica_metrics

    made = record_gauges(monkeypatch, replica_metrics.metrics)
    names = rd.ray_names(rd.sglang_dashboard())
    text = _exposition(names)
    relay = replica_metrics.EngineRelay()
    samples = [line for line in text.splitlines() if line.startswith(mc.SGLANG_PREFIX)]
    assert relay.relay(text) == len(samples)
    scraped = {_scraped(name): gauge for name, gauge in made.items()}
    # Every name Ray's dashboard reads, with the engine's labels and value.
    assert names <= set(scraped), sorted(names - set(scraped))
    assert scraped["ray_sglang_prompt_tokens_total"].values == {(("model_name", "m"),): 7.0}
    # SGLang's own name for every sample, with the same value.
    own = {n for n in scraped if n.startswith(mc.SGLANG_PREFIX)}
    assert own == {line.split("{")[0] for line in samples} and "sglang:gen_throughput" in own
    for name in names:
        assert scraped[name].values == scraped[mc.SGLANG_PREFIX + name.removeprefix("ray_sglang_")].values
    # Whole families are copied (a histogram's _sum too), no family Ray's dashboard does not
    # read, and no name is left unrenamed.
    assert set(scraped) == own | {"ray_sglang_" + n.removeprefix(mc.SGLANG_PREFIX)
                                  for n in own - {"sglang:gen_throughput"}}


def test_grafana_values_for_rays_variables():
    variables = rd.variables(rd.sglang_dashboard())
    model, deployment, interval = variables["sglang_model_name"], variables["deployment"], variables["interval"]
    assert rd.grafana_value(model) == rd.grafana_value(deployment) == ".*"  # All
    assert rd.grafana_value(interval) == "5m"  # the custom variable's default
    # One value is regex-escaped inside the PromQL string; several become (a|b).
    assert rd.grafana_value(model, ["Qwen/Qwen3.6-27B"]) == r"Qwen/Qwen3\\.6-27B"
    assert rd.grafana_value(deployment, ["A", "B(1)"]) == r"(A|B\\(1\\))"
    assert rd.label_values_query(model) == ("ray_sglang_prompt_tokens_total{}", "model_name")
