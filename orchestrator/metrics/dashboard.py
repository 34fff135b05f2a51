"""The exporter's Grafana dashboard, as code: ``python -m orchestrator.metrics.dashboard``.

Built with the Grafana Foundation SDK (a dev dependency): only tests and this module's ``main``
import it, never the CLI or the service. ``write`` regenerates the committed files under
``dashboards/``: the dashboard JSON and Grafana provisioning for it and a Prometheus datasource.

Every panel query filters on ``kappa_job=~"$job"`` and ``version=~"$version"``, except the
exporter panel (the exporter's own metrics carry no job or version). The label is ``kappa_job``,
not ``job``, which Prometheus sets to the scrape job's name. The dashboard links the alert rules
that ship beside it (``dashboards/kappa-alerts.yml``), as loaded into Grafana's alerting.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import statetimeline as statetimeline_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm

from orchestrator.lag import LagState
from orchestrator.metrics.dashboard_archive import archive_panels, archive_row
from orchestrator.metrics.dashboard_budget import budget_panels, budget_row
from orchestrator.metrics.dashboard_cutover import cutover_panels, cutover_row
from orchestrator.metrics.dashboard_panels import DS
from orchestrator.metrics.dashboard_panels import query as _query
from orchestrator.metrics.dashboard_panels import stat as _stat
from orchestrator.metrics.dashboard_panels import thresholds as _thresholds
from orchestrator.metrics.dashboard_panels import timeseries as _timeseries
from orchestrator.metrics.grafana_provisioning import (
    DATASOURCE_UID,
    PROVISIONING_DASHBOARDS,
    PROVISIONING_DATASOURCES,
)

UID = "kappa-replay"
TITLE = "Kappa reprocessing"
TAGS = ["kappa", "kappa-orchestrator", "reprocessing"]
DASHBOARD_FILE = "kappa-replay.json"
ALERTS_FILE = "kappa-alerts.yml"
# Grafana's list of alert rules, filtered to kappa's group (the rules file's group name).
ALERTS_URL = "/alerting/list?search=group:kappa"
DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "dashboards"

SEL = 'kappa_job=~"$job", version=~"$version"'
BY_VERSION = "{{kappa_job}} {{version}}"
BY_PARTITION = "{{kappa_job}} {{version}} {{topic}}/{{partition}}"
RATE_UNIT = "suffix: rec/s"
# Dashboard-level variables that panel_queries substitutes with a concrete duration.
_INTERVALS = re.compile(r"\$(?:__rate_interval|__interval|__range)\b|\$\{(?:__rate_interval|"
                        r"__interval|__range)\}")
_VARIABLES = re.compile(r"\$(?:\{(job|version)\}|(job|version)\b)")
_STATE_COLORS = {
    LagState.CATCHING_UP: "blue",
    LagState.CAUGHT_UP: "green",
    LagState.STALLED: "red",
    LagState.FALLING_BEHIND: "orange",
    LagState.STOPPED: "text",
    LagState.LOG_GONE: "purple",
}
_ALIAS_SWITCHES = 'changes(kappa_alias_switches_total{kappa_job=~"$job"}[1m]) > 0'


def _per_version(metric: str) -> str:
    return f"max by (kappa_job, version) ({metric}{{{SEL}}})"


def _per_partition(metric: str) -> str:
    return f"max by (kappa_job, version, topic, partition) ({metric}{{{SEL}}})"


def _state_expr() -> str:
    """One series per version whose value is the index (1-based) of its current state.

    Every state's 0/1 gauge is multiplied by its code and the max per version is kept, so the
    query returns a value for every version (never an empty result in steady state) and the
    panel's value mappings turn the code back into the state name.
    """
    parts = [f'kappa_state{{{SEL}, state="{state.value}"}} * {code}'
             for code, state in enumerate(LagState, start=1)]
    return f"max by (kappa_job, version) ({' or '.join(parts)})"


def _state_mappings() -> list[dm.ValueMapping]:
    options = {str(code): dm.ValueMappingResult(text=state.value, color=_STATE_COLORS[state],
                                                index=code - 1)
               for code, state in enumerate(LagState, start=1)}
    options["0"] = dm.ValueMappingResult(text="unknown", color="text", index=len(options))
    return [dm.ValueMap(options=options)]


def _panels() -> list[cogbuilder.Builder[dm.Panel]]:
    lag_records = _timeseries(
        1, "Lag (records)", "Records behind the log end, all partitions of the job's topics.",
        "short", 12,
        _query("A", _per_version("kappa_lag_records"), BY_VERSION))
    lag_seconds = _timeseries(
        2, "Lag (seconds)", "Age of the oldest unprocessed record; 0 when caught up.", "s", 12,
        _query("A", _per_version("kappa_lag_seconds"), BY_VERSION))
    state = (statetimeline_b.Panel().id(3).title("Lag state")
             .description("Each version's lag state (kappa_state): catching_up, caught_up, "
                          "stalled, falling_behind, stopped or log_gone.")
             .datasource(DS).span(16).height(8)
             .with_target(_query("A", _state_expr(), BY_VERSION))
             .mappings(_state_mappings()).show_value(common.VisibilityMode.AUTO)
             .merge_values(True).row_height(0.9).line_width(0).fill_opacity(80)
             .legend(common_b.VizLegendOptions().show_legend(False)
                     .display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM))
             .tooltip(common_b.VizTooltipOptions().mode(common.TooltipDisplayMode.SINGLE)
                      .sort(common.SortOrder.NONE))
             .color_scheme(dashboard_b.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
             .thresholds(_thresholds((None, "text"))))
    eta = (_stat(4, "ETA to caught up",
                 "Seconds until the version is caught up at the current rates; "
                 "'not converging' when it does not gain on the log (kappa_eta_seconds = +Inf).",
                 8, _query("A", _per_version("kappa_eta_seconds"), BY_VERSION, instant=True))
           .unit("s").decimals(0)
           .mappings([dm.ValueMap(options={
               "Infinity": dm.ValueMappingResult(text="not converging", color="orange", index=0),
               "+Inf": dm.ValueMappingResult(text="not converging", color="orange", index=1)})])
           .thresholds(_thresholds((None, "green"))))
    throughput = _timeseries(
        5, "Replay throughput", "Records processed by the version vs records produced to its "
        "topics, per second over the sampler's window.", RATE_UNIT, 12,
        _query("A", _per_version("kappa_processing_rate_records_per_second"),
               BY_VERSION + " processed"),
        _query("B", _per_version("kappa_produce_rate_records_per_second"),
               BY_VERSION + " produced"))
    partition_lag = _timeseries(
        6, "Partition lag (records)", "Records behind the log end, per topic partition.",
        "short", 12,
        _query("A", _per_partition("kappa_partition_lag_records"), BY_PARTITION))
    columns = [("A", "kappa_log_start_offset", "log start"),
               ("B", "kappa_log_end_offset", "log end"),
               ("C", "kappa_processed_offset", "processed"),
               ("D", "kappa_partition_lag_records", "lag (records)"),
               ("E", "kappa_partition_lag_seconds", "lag (s)")]
    partitions = (table_b.Panel().id(7).title("Partitions")
                  .description("Offsets and lag of every topic partition, now.")
                  .datasource(DS).span(24).height(8)
                  .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
                  .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                      "excludeByName": {"Time": True},
                      "indexByName": {name: i for i, name in enumerate(
                          ["kappa_job", "version", "topic", "partition",
                           *(f"Value #{ref}" for ref, _, _ in columns)])},
                      "renameByName": {f"Value #{ref}": label for ref, _, label in columns},
                  }))
                  .sort_by([common_b.TableSortByFieldState().display_name("lag (records)")
                            .desc(True)])
                  .cell_height(common.TableCellHeight.SM)
                  .override_by_name("lag (s)", [dm.DynamicConfigValue(id_val="unit",
                                                                      value="s")]))
    for ref, metric, _ in columns:
        partitions = partitions.with_target(
            _query(ref, _per_partition(metric), "", instant=True, table=True))
    dead_letters = (_stat(
        8, "Dead letters", "Invalid events routed to the version's dead-letter table: new in "
        "the selected time range, and in total.", 6,
        _query("A", f"sum by (kappa_job, version) (increase(kappa_dead_letters_total{{{SEL}}}"
                    "[$__range]))", BY_VERSION + " in range", instant=True),
        _query("B", _per_version("kappa_dead_letters_total"), BY_VERSION + " total",
               instant=True))
        .unit("short").decimals(0)
        .thresholds(_thresholds((None, "green"), (1, "orange"))))
    output_rows = _timeseries(
        9, "Output rows", "Rows in the version's output table.", "short", 6,
        _query("A", _per_version("kappa_output_rows"), BY_VERSION))
    heartbeat = (_timeseries(
        10, "Driver heartbeat age", "Seconds since the version's driver last heartbeat "
        "(drivers beat every 2 s by default).", "s", 6,
        _query("A", _per_version("kappa_driver_heartbeat_age_seconds"), BY_VERSION))
        .thresholds(_thresholds((None, "green"), (10, "orange"), (30, "red")))
        .thresholds_style(common_b.GraphThresholdsStyleConfig()
                          .mode(common.GraphTresholdsStyleMode.LINE)))
    exporter = (_stat(
        11, "Exporter", "Whether the exporter serves stale values (its last refresh failed), "
        "how old the served values are, and refreshes failed since it started. "
        "Global: not filtered by job or version.", 6,
        _query("A", "max(kappa_exporter_stale)", "values", instant=True),
        _query("B", "time() - min(kappa_exporter_last_success_timestamp_seconds)",
               "age", instant=True),
        _query("C", "sum(kappa_exporter_refresh_failures_total)", "failed refreshes",
               instant=True))
        .thresholds(_thresholds((None, "green")))
        .override_by_query("A", [
            dm.DynamicConfigValue(id_val="mappings", value=[dm.ValueMap(options={
                "0": dm.ValueMappingResult(text="fresh", color="green", index=0),
                "1": dm.ValueMappingResult(text="stale", color="red", index=1)})])])
        .override_by_query("B", [
            dm.DynamicConfigValue(id_val="unit", value="s"),
            dm.DynamicConfigValue(id_val="decimals", value=0),
            dm.DynamicConfigValue(id_val="thresholds", value=_thresholds(
                (None, "green"), (30, "orange"), (120, "red")).build())])
        .override_by_query("C", [
            dm.DynamicConfigValue(id_val="decimals", value=0),
            dm.DynamicConfigValue(id_val="thresholds", value=_thresholds(
                (None, "green"), (1, "orange")).build())]))
    return [lag_records, lag_seconds, state, eta, throughput, partition_lag, partitions,
            dead_letters, output_rows, heartbeat, exporter]


def _builder() -> dashboard_b.Dashboard:
    prom_ds = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (dashboard_b.Dashboard(TITLE).uid(UID).tags(TAGS)
             .description("Lag, state, throughput and health of the Kappa orchestrator's "
                          "versions (kappa agent / kappa metrics serve).")
             .refresh("10s").time("now-1h", "now").timezone("browser")
             .tooltip(dm.DashboardCursorSync.CROSSHAIR)
             .with_variable(dashboard_b.DatasourceVariable("datasource").label("Data source")
                            .type("prometheus")
                            .current(dm.VariableOption(text="Prometheus",
                                                       value=DATASOURCE_UID)))
             .with_variable(dashboard_b.QueryVariable("job").label("Job").datasource(prom_ds)
                            .query("label_values(kappa_lag_records, kappa_job)")
                            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                            .sort(dm.VariableSort.ALPHABETICAL_ASC)
                            .multi(True).include_all(True))
             .with_variable(dashboard_b.QueryVariable("version").label("Version")
                            .datasource(prom_ds)
                            .query('label_values(kappa_lag_records{kappa_job=~"$job"}, '
                                   'version)')
                            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                            .sort(dm.VariableSort.ALPHABETICAL_ASC)
                            .multi(True).include_all(True))
             .link(dashboard_b.DashboardLink("Alert rules").type(dm.DashboardLinkType.LINK)
                   .url(ALERTS_URL).icon("bolt").keep_time(False).include_vars(False)
                   .target_blank(False).as_dropdown(False)
                   .tooltip("kappa's alert rules (dashboards/kappa-alerts.yml), as loaded "
                            "into Grafana's alerting"))
             .annotation(dashboard_b.AnnotationQuery().name("Alias switches")
                         .datasource(prom_ds).enable(True).hide(False)
                         .icon_color("purple").expr(_ALIAS_SWITCHES)))
    for panel in _panels():
        board = board.with_panel(panel)
    board = board.with_row(archive_row(20))
    for panel in archive_panels(21):
        board = board.with_panel(panel)
    board = board.with_row(cutover_row(30))
    for panel in cutover_panels(31):
        board = board.with_panel(panel)
    board = board.with_row(budget_row(40))
    for panel in budget_panels(41):
        board = board.with_panel(panel)
    return board


def build_dashboard() -> dict[str, Any]:
    """The dashboard's JSON model, importable by Grafana 10+."""
    model: dict[str, Any] = json.loads(json.dumps(_builder().build(), cls=JSONEncoder))
    for annotation in model["annotations"]["list"]:
        if annotation.get("expr") == _ALIAS_SWITCHES:
            # The SDK's AnnotationQuery has no fields for Prometheus's annotation options.
            annotation.update({"step": "15s", "titleFormat": "Alias {{alias}} switched",
                               "textFormat": "{{kappa_job}}: alias {{alias}} now points "
                                             "elsewhere",
                               "tagKeys": "kappa_job,alias", "useValueForTime": False})
    # What the SDK writes that Grafana's schema (@grafana/schema 13) does not know: a
    # placeholder id and the interval variable's fields on every variable, and the
    # dashboard's retired `style`.
    model.pop("style", None)
    for variable in model["templating"]["list"]:
        variable.pop("id", None)
        if variable["type"] != "interval":
            for key in ("auto", "auto_min", "auto_count"):
                variable.pop(key, None)
    return model


def _regex_literal(value: str) -> str:
    """``value`` as an RE2 literal inside a double-quoted PromQL string."""
    escaped = re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\1", value)
    return escaped.replace("\\", "\\\\").replace('"', '\\"')


def panel_queries(job: str, version: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, ready for Prometheus's HTTP API:
    ``$job``/``$version`` are replaced by regex-safe literals and ``$__range`` and the
    interval variables by ``1m``. Annotations are not included."""
    values = {"job": _regex_literal(job), "version": _regex_literal(version)}
    found = []
    for panel in build_dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = _INTERVALS.sub("1m", target["expr"])
            expr = _VARIABLES.sub(lambda m: values[m.group(1) or m.group(2)], expr)
            found.append((panel["title"], expr))
    return found


def write(directory: Path) -> list[Path]:
    """Write the dashboard JSON and Grafana provisioning files under ``directory``."""
    directory = Path(directory)
    dashboard = directory / DASHBOARD_FILE
    dashboards_yaml = directory / "provisioning" / "dashboards" / "kappa.yaml"
    datasources_yaml = directory / "provisioning" / "datasources" / "prometheus.yaml"
    contents = {
        dashboard: json.dumps(build_dashboard(), sort_keys=True, indent=2) + "\n",
        dashboards_yaml: PROVISIONING_DASHBOARDS,
        datasources_yaml: PROVISIONING_DATASOURCES,
    }
    for path, text in contents.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(contents)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else DASHBOARDS_DIR
    for path in write(directory):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
