"""Minimal Grafana dashboard generator.

Panels are declared as data (``Panel``/``Row``); ids and gridPos are assigned
here so nobody hand-numbers them and inserting a panel never breaks layout or
the alert -> panel links (those go through ``Panel.key``).  Every query uses the
``$datasource`` template variable so the dashboard works with whatever the
Prometheus datasource is called (Ray names it after RAY_PROMETHEUS_NAME).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

GRID_WIDTH = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39  # Grafana 10.4 / 11.x


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    targets: Sequence[Target]
    kind: str = "timeseries"  # "timeseries" | "stat"
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    # Drawn as a red line (timeseries) or turns the stat red (stat).
    threshold: Optional[float] = None
    # For lower-is-bad thresholds (e.g. engine_up < 1): colours below the line red.
    threshold_below: bool = False
    min: Optional[float] = None
    max: Optional[float] = None
    key: Optional[str] = None  # stable handle for links (alerts -> panel id)
    mappings: Sequence[dict] = ()
    stack: bool = False


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[Panel] = field(default_factory=tuple)


def datasource_variable() -> dict:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "refresh": 1,
        "regex": "",
    }


def query_variable(name: str, label: str, query: str, multi: bool = True) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-var"},
        "refresh": 2,  # on time-range change: new runs appear without a reload
        "includeAll": True,
        "allValue": ".*",
        "multi": multi,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def _thresholds(p: Panel) -> dict:
    if p.threshold is None:
        steps = [{"color": "green", "value": None}]
    elif p.threshold_below:
        steps = [{"color": "red", "value": None}, {"color": "green", "value": p.threshold}]
    else:
        steps = [{"color": "green", "value": None}, {"color": "red", "value": p.threshold}]
    return {"mode": "absolute", "steps": steps}


def _targets(p: Panel) -> List[dict]:
    out = []
    for i, t in enumerate(p.targets):
        tgt = {"datasource": DATASOURCE, "expr": t.expr, "legendFormat": t.legend or "__auto",
               "refId": chr(ord("A") + i), "editorMode": "code"}
        if p.kind == "stat":
            tgt["instant"] = True  # stats show the current value; no range query needed
        else:
            tgt["range"] = True
        out.append(tgt)
    return out


def _panel_json(p: Panel, panel_id: int, grid: dict) -> dict:
    defaults: Dict = {"unit": p.unit, "thresholds": _thresholds(p), "mappings": list(p.mappings)}
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    if p.kind == "timeseries":
        defaults["color"] = {"mode": "palette-classic"}
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
            # Draw the alert threshold as a line on the graph itself.
            "thresholdsStyle": {"mode": "line" if p.threshold is not None else "off"},
        }
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif p.kind == "stat":
        defaults["color"] = {"mode": "thresholds"}
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
        }
    else:
        raise ValueError(f"unsupported panel kind {p.kind!r}")
    return {
        "id": panel_id,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": _targets(p),
    }


def layout(rows: Sequence[Row]) -> Tuple[List[dict], Dict[str, int]]:
    """Flow panels left-to-right, wrapping at 24 columns; one Grafana row per Row.

    Returns the panels JSON and ``{panel.key: id}``.
    """
    panels: List[dict] = []
    keys: Dict[str, int] = {}
    next_id = 1
    y = 0
    for row in rows:
        panels.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        x, line_h = 0, 0
        for p in row.panels:
            if not 0 < p.width <= GRID_WIDTH:
                raise ValueError(f"panel {p.title!r}: width {p.width} outside 1..{GRID_WIDTH}")
            if x + p.width > GRID_WIDTH:  # wrap
                y, x, line_h = y + line_h, 0, 0
            panels.append(_panel_json(p, next_id, {"h": p.height, "w": p.width, "x": x, "y": y}))
            if p.key:
                if p.key in keys:
                    raise ValueError(f"duplicate panel key {p.key!r}")
                keys[p.key] = next_id
            next_id += 1
            x += p.width
            line_h = max(line_h, p.height)
        y += line_h
    return panels, keys


def dashboard(title: str, uid: str, rows: Sequence[Row], variables: Sequence[dict],
              tags: Sequence[str] = (), refresh: str = "30s", time_from: str = "now-6h",
              description: str = "") -> Tuple[dict, Dict[str, int]]:
    panels, keys = layout(rows)
    doc = {
        "title": title,
        "uid": uid,
        "description": description,
        "tags": list(tags),
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: line up throughput dips with errors
        "refresh": refresh,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "timezone": "",
        "links": [],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "templating": {"list": list(variables)},
        "panels": panels,
    }
    return doc, keys
