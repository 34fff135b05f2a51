"""The panel builders every row of the dashboard uses (dashboard.py, dashboard_archive.py,
dashboard_cutover.py): queries, time series and stats on the dashboard's datasource."""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import prometheus as prometheus_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import timeseries as timeseries_b
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as prometheus_m

# Panels and variables use the datasource variable, so the dashboard imports into any Grafana
# with a Prometheus datasource (the provisioned one, uid "prometheus", is the default).
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def query(ref_id: str, expr: str, legend: str, *, instant: bool = False,
           table: bool = False) -> prometheus_b.Dataquery:
    q = (prometheus_b.Dataquery().ref_id(ref_id).expr(expr).legend_format(legend)
         .datasource(DS).editor_mode(prometheus_m.QueryEditorMode.CODE))
    if table:
        q = q.format(prometheus_m.PromQueryFormat.TABLE)
    return q.instant() if instant else q.range()


def _legend() -> common_b.VizLegendOptions:
    return (common_b.VizLegendOptions().show_legend(True)
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM).calcs(["lastNotNull", "max"]))


def _tooltip() -> common_b.VizTooltipOptions:
    return (common_b.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING))


def thresholds(*steps: tuple[float | None, str]) -> dashboard_b.ThresholdsConfig:
    return (dashboard_b.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=value, color=color) for value, color in steps]))


def timeseries(panel_id: int, title: str, description: str, unit: str, width: int,
                *targets: prometheus_b.Dataquery) -> timeseries_b.Panel:
    panel = (timeseries_b.Panel().id(panel_id).title(title).description(description)
             .datasource(DS).unit(unit).min(0).span(width).height(8)
             .legend(_legend()).tooltip(_tooltip()).line_width(1).fill_opacity(10)
             .show_points(common.VisibilityMode.NEVER).span_nulls(False)
             .thresholds(thresholds((None, "green"))))
    for target in targets:
        panel = panel.with_target(target)
    return panel


def stat(panel_id: int, title: str, description: str, width: int,
          *targets: prometheus_b.Dataquery) -> stat_b.Panel:
    panel = (stat_b.Panel().id(panel_id).title(title).description(description)
             .datasource(DS).span(width).height(8)
             .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
             .graph_mode(common.BigValueGraphMode.NONE)
             .color_mode(common.BigValueColorMode.VALUE)
             .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
             .justify_mode(common.BigValueJustifyMode.AUTO)
             .orientation(common.VizOrientation.HORIZONTAL))
    for target in targets:
        panel = panel.with_target(target)
    return panel
