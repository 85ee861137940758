"""raygen's Grafana house style on Grafana's own typed builders (grafana-foundation-sdk).

``panels.py`` makes panels with ``timeseries(...)`` / ``stat(...)`` -- the SDK's panel
builders with raygen's defaults -- and chains SDK methods on them (``.unit``, ``.min``,
``.span``, ...).  The SDK lays panels out on the grid and writes the JSON with Grafana
11.6's field names and enums; ``dashboard()`` only numbers the panels, because the
Grafana alert rules link to panel ids (through ``.key()``), so nobody hand-numbers them.
Every query uses the ``$datasource`` template variable so the dashboard works whatever
the Prometheus datasource is called (Ray names it after RAY_PROMETHEUS_NAME).
"""

from __future__ import annotations

import copy
import itertools
import json
import string
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.builders import stat as sb
from grafana_foundation_sdk.builders import timeseries as tb
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

GRID_WIDTH = 24
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def target(expr: str, legend: str = "") -> pb.Dataquery:
    return (pb.Dataquery().expr(expr).legend_format(legend or "__auto")
            .editor_mode(pm.QueryEditorMode.CODE).datasource(DATASOURCE))


def _steps(*steps: Tuple[str, Optional[float]]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(color=color, value=value) for color, value in steps])


def value_map(values: Dict[str, Tuple[str, str]]) -> dm.ValueMap:
    """``value_map({"0": ("DOWN", "red")})``: show a value as text in a colour."""
    return dm.ValueMap(options={v: dm.ValueMappingResult(text=text, color=color, index=i)
                                for i, (v, (text, color)) in enumerate(values.items())})


class _Keyed:
    panel_key: Optional[str] = None

    def key(self, name: str):
        """A stable handle the alert rules link through (alerts.Alert.panel_key -> panel id)."""
        self.panel_key = name
        return self


class TimeSeries(_Keyed, tb.Panel):
    def alert_line(self, value: float) -> "TimeSeries":
        """Draw the alert threshold as a red line on the graph itself."""
        return self.thresholds(_steps(("green", None), ("red", value))).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE))

    def stacked(self) -> "TimeSeries":
        return self.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))


class Stat(_Keyed, sb.Panel):
    def red_below(self, value: float) -> "Stat":
        """For lower-is-bad values (e.g. engine_up < 1)."""
        return self.thresholds(_steps(("red", None), ("green", value)))


def _panel(panel, title: str, targets: Sequence[pb.Dataquery], instant: bool):
    for ref, t in zip(string.ascii_uppercase, targets):
        # Stats show the current value: an instant query, no range needed.
        panel.with_target(t.ref_id(ref).instant() if instant else t.ref_id(ref).range())
    return (panel.title(title).description("").datasource(DATASOURCE).span(12).height(8).unit("short")
            .thresholds(_steps(("green", None))).mappings([]).overrides([]))


def timeseries(title: str, *targets: pb.Dataquery) -> TimeSeries:
    return (_panel(TimeSeries(), title, targets, instant=False)
            .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC))
            .draw_style(cm.GraphDrawStyle.LINE).line_width(1).fill_opacity(10)
            .show_points(cm.VisibilityMode.NEVER).span_nulls(False)
            .stacking(cb.StackingConfig().mode(cm.StackingMode.NONE).group("A"))
            .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.OFF))
            .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                    .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
            .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)))


def stat(title: str, *targets: pb.Dataquery) -> Stat:
    return (_panel(Stat(), title, targets, instant=True)
            .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
            .color_mode(cm.BigValueColorMode.VALUE).graph_mode(cm.BigValueGraphMode.NONE)
            .justify_mode(cm.BigValueJustifyMode.AUTO).orientation(cm.VizOrientation.AUTO)
            .text_mode(cm.BigValueTextMode.AUTO))


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[_Keyed] = ()


def datasource_variable() -> db.DatasourceVariable:
    return (db.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .hide(dm.VariableHide.DONT_HIDE).include_all(False).multi(False).regex(""))


def query_variable(name: str, label: str, query: str, multi: bool = True) -> db.QueryVariable:
    return (db.QueryVariable(name).label(label).datasource(DATASOURCE).query({"query": query, "refId": f"{name}-var"})
            # On time-range change: new runs appear without a reload.
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True).all_value(".*").multi(multi)
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
            .sort(dm.VariableSort.ALPHABETICAL_ASC).hide(dm.VariableHide.DONT_HIDE))


def dashboard(title: str, uid: str, rows: Sequence[Row], variables: Sequence, tags: Sequence[str] = (),
              refresh: str = "30s", time_from: str = "now-6h", description: str = "") -> Tuple[dict, Dict[str, int]]:
    """The dashboard JSON and ``{panel key: panel id}``; ids number rows and panels from 1 in order."""
    builder = (db.Dashboard(title).uid(uid).description(description).tags(list(tags)).editable()
               .tooltip(dm.DashboardCursorSync.CROSSHAIR)  # shared crosshair: line up throughput dips with errors
               .refresh(refresh).version(1).time(time_from, "now").timezone("").links([]).variables(list(variables))
               .annotation(db.AnnotationQuery().built_in(1).datasource(dm.DataSourceRef(type_val="grafana",
                                                                                         uid="-- Grafana --"))
                           .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)").name("Annotations & Alerts")
                           .type("dashboard")))
    keys: Dict[str, int] = {}
    ids = itertools.count(1)
    for row in rows:
        builder.with_row(db.Row(row.title).id(next(ids)))
        for declared in row.panels:
            p = copy.deepcopy(declared)  # the SDK positions and we number the panel: keep panels.py's as declared
            builder.with_panel(p.id(next(ids)))
            if p.panel_key:
                if p.panel_key in keys:
                    raise ValueError(f"duplicate panel key {p.panel_key!r}")
                keys[p.panel_key] = p.build().id_val
    built = builder.build()
    # The SDK starts a new line only once a line is full: a panel that does not fit runs off the grid.
    off_grid = [p.title for p in built.panels if p.grid_pos.x + p.grid_pos.w > GRID_WIDTH]
    if off_grid:
        raise ValueError(f"panels past column {GRID_WIDTH}: {off_grid}; make each line's widths add up to it")
    return json.loads(JSONEncoder().encode(built)), keys
