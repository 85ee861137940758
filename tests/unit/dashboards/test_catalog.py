"""The metrics contract: catalog <-> METRICS.md, and the catalog stays import-light."""

from __future__ import annotations

import re

from dashboards import metrics_catalog as mc

from tests.support.dashboards import DASH, REPO


def test_catalog_entries_are_well_formed():
    assert len(mc.CATALOG) == len({m.name for m in mc.CATALOG})
    for m in mc.CATALOG:
        assert re.fullmatch(r"raygen_[a-z0-9_]+", m.name), m.name
        assert m.type in (mc.COUNTER, mc.GAUGE, mc.HISTOGRAM), m
        assert m.source in (mc.REPLICA, mc.JOB), m
        assert m.description.strip(), m
        # Serve adds these itself and rejects them as user tag keys.
        assert not set(m.labels) & set(mc.SERVE_LABELS), m
        if m.source == mc.JOB or m.type != mc.GAUGE:
            assert {"run", "model"} <= set(m.labels), f"{m.name} must carry run and model"
        else:
            assert "model" in m.labels, m


def test_exported_names_follow_ray_conventions():
    assert mc.OUTPUT_TOKENS.prom_name == "ray_raygen_output_tokens_total"
    assert mc.ACCEPT_LENGTH.series_names == (
        "ray_raygen_accept_length_bucket", "ray_raygen_accept_length_sum", "ray_raygen_accept_length_count")
    assert mc.REQUEST_LATENCY.series_names[0] == "ray_raygen_request_latency_seconds_bucket"
    assert "completions" in mc.COMPLETIONS.name and "finish_reason" in mc.COMPLETIONS.labels


def test_metrics_md_lists_exactly_the_catalog():
    text = (DASH / "METRICS.md").read_text()
    rows = dict(re.findall(r"^\| `(ray_raygen_\w+)` \| (\w+) \|", text, flags=re.M))
    assert set(rows) == set(mc.BY_PROM_NAME), (
        f"only in METRICS.md: {set(rows) - set(mc.BY_PROM_NAME)}; "
        f"only in catalog: {set(mc.BY_PROM_NAME) - set(rows)}")
    for name, typ in rows.items():
        assert mc.BY_PROM_NAME[name].type == typ, f"{name}: METRICS.md says {typ}"


def test_emitters_take_metric_names_from_the_catalog():
    """serve_apps/ and jobs/ never spell a metric name: no ``raygen_*`` literal, and every
    Counter/Gauge/Histogram(...) call gets its name from an expression (``m.name``,
    ``mc.relay_name(...)``), so a renamed metric changes in the catalog only."""
    import ast

    kinds = ("Counter", "Gauge", "Histogram")
    literals, spelled, calls, importers = [], [], 0, set()
    for folder in ("serve_apps", "jobs"):
        for path in (REPO / folder).rglob("*.py"):
            rel = str(path.relative_to(REPO))
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and re.fullmatch(r"raygen_[a-z0-9_]+", node.value):
                    literals.append(f"{rel}: {node.value}")
                if isinstance(node, ast.ImportFrom) and node.module == "dashboards" \
                        and any(a.name == "metrics_catalog" for a in node.names):
                    importers.add(rel)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in kinds and node.args:
                    calls += 1
                    if isinstance(node.args[0], ast.Constant):
                        spelled.append(f"{rel}:{node.lineno}: {node.args[0].value!r}")
    assert not literals, f"metric names spelled outside the catalog: {literals}"
    assert not spelled, f"metrics created with a literal name: {spelled}"
    # The walk saw the emitters: both import the catalog and create their metrics.
    assert {"serve_apps/replica_metrics.py", "jobs/runs/job_metrics.py"} <= importers
    assert calls >= 5, calls


def test_names_follow_prometheus_conventions():
    """Base units (_seconds), _total only on counters (Ray appends it), _ratio for 0..1
    fractions, no rate units in names (tok/s is a query, not a metric)."""
    for m in mc.CATALOG:
        assert not m.name.endswith("_total"), f"{m.name}: only counters end in _total (Ray adds it)"
        assert not re.search(r"(_s|_ms|tok_s|_per_second)(_|$)", m.name), f"{m.name}: not a base unit"
        if re.search(r"latency|eta|timestamp|duration", m.name):
            assert m.name.endswith("_seconds"), m.name
        if "0..1" in m.description:
            assert m.name.endswith("_ratio"), m.name


def test_relay_names_map_back_to_sglangs_names():
    assert mc.relay_name("sglang:time_to_first_token_seconds_bucket") == "relay_sglang_time_to_first_token_seconds_bucket"
    assert mc.ray_dashboard_name("sglang:time_to_first_token_seconds_bucket") == "sglang_time_to_first_token_seconds_bucket"
    # Every Ray export of a relayed name, ray_relay_sglang_<x>, is renamed by the scrape config to sglang:<x>.
    assert all(s.startswith(mc.SGLANG_PREFIX) for s in mc.SGLANG_SERIES | mc.RAY_DASHBOARD_SGLANG_FAMILIES)
