"""Ray's own "Serve LLM SGLang" Grafana dashboard, as the installed Ray builds it, and
the values Grafana puts for its template variables (tests.support.prometheus.substitute
fills them in): for the tests that hold raygen's relay to what that dashboard reads
(tests/unit/dashboards/test_ray_sglang_dashboard.py,
tests/integration/sglang/test_metrics_live.py).

The dashboard comes from Ray's own generator (the JSON Ray provisions into Grafana, its
``{global_filters}`` already filled as Ray fills them), never from a copy.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

RAY_NAME_RE = re.compile(r"(?<![\w:])(ray_sglang_\w+)")
LABEL_VALUES_RE = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def sglang_dashboard() -> dict[str, Any]:
    """The dashboard JSON Ray 2.60 provisions for uid rayServeLlmSglangDashboard."""
    from ray.dashboard.modules.metrics import grafana_dashboard_factory as factory
    text, uid = factory.generate_serve_llm_sglang_grafana_dashboard()
    dashboard = json.loads(text)
    assert uid == dashboard["uid"] == "rayServeLlmSglangDashboard", uid
    return dashboard


def targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title [refId], PromQL) of every panel target, rows' panels included."""
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    return [(f"{p['title']} [{t['refId']}]", t["expr"]) for p in panels for t in p.get("targets", [])]


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def label_values_query(variable: dict[str, Any]) -> tuple[str, str]:
    """(series selector, label) of a ``label_values(selector, label)`` query variable."""
    m = LABEL_VALUES_RE.match(variable["query"]["query"])
    assert m, f"variable {variable['name']}: not a label_values query: {variable['query']}"
    return m["selector"], m["label"]


def ray_names(dashboard: dict[str, Any]) -> set[str]:
    """Every ray_sglang_* series name the dashboard reads, panels and variables."""
    texts = [expr for _, expr in targets(dashboard)]
    texts += [v["query"]["query"] for v in variables(dashboard).values() if isinstance(v.get("query"), dict)]
    return {name for text in texts for name in RAY_NAME_RE.findall(text)}


def family(ray_name: str) -> str:
    """ray_sglang_<x>[_bucket|_sum|_count|_total] -> SGLang's family name sglang:<x>
    (a counter's family without _total, as its TYPE line names it once parsed)."""
    rest = ray_name.removeprefix("ray_sglang_")
    for suffix in ("_bucket", "_sum", "_count", "_total"):
        if rest.endswith(suffix):
            return "sglang:" + rest.removesuffix(suffix)
    return "sglang:" + rest


def _regex_escape(value: str) -> str:
    # Grafana's prometheusSpecialRegexEscape (public/app/plugins/datasource/prometheus/
    # datasource.ts, classic behaviour): inside a PromQL string, so backslashes twice.
    return re.sub(r"[$^*{}\[\]+?.()|]", lambda m: "\\\\" + m[0], value.replace("\\", "\\\\\\\\"))


def grafana_value(variable: dict[str, Any], selected: Optional[list[str]] = None) -> str:
    """What Grafana's Prometheus data source puts for ``$<variable>`` in a query
    (interpolateQueryExpr): ``selected=None`` is All (the variable's allValue) or a
    custom variable's current value; a multi/include-all variable's values are regex
    escaped, several joined as ``(a|b)``."""
    if selected is None:
        if variable.get("includeAll"):
            return variable["allValue"]
        return variable["current"]["value"]
    if not variable.get("multi") and not variable.get("includeAll"):
        assert len(selected) == 1, (variable["name"], selected)
        return selected[0].replace("\\", "\\\\").replace("'", "\\\\'")
    escaped = [_regex_escape(v) for v in selected]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

