"""The dashboard's row for the archive of the log: how far behind the log it is, in records
and in seconds, how many segments and bytes it holds, and how close the broker's retention is to
records it has not copied, per topic.

Global panels: the archive is kept per topic (of the lineage the broker holds now), not per job
or version. Its figures come from the agent's exporter while the agent archives.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dm

from orchestrator.metrics.dashboard_panels import query as _query
from orchestrator.metrics.dashboard_panels import stat as _stat
from orchestrator.metrics.dashboard_panels import thresholds as _thresholds
from orchestrator.metrics.dashboard_panels import timeseries as _timeseries

ROW_TITLE = "Archive of the log"
TITLES = ("Archive lag (records)", "Archive lag (seconds)", "Archive size",
          "Retention headroom")
BY_TOPIC = "{{topic}}"


def archive_panels(first_id: int) -> list[cogbuilder.Builder[dm.Panel]]:
    behind = _timeseries(
        first_id, TITLES[0], "Records of the log not archived yet, per topic; 0 when the "
        "archive has reached the log end. Global: not filtered by job or version.", "short", 6,
        _query("A", "sum by (topic) (kappa_archive_lag_records)", BY_TOPIC))
    age = (_timeseries(
        first_id + 1, TITLES[1], "Age of the oldest record not archived yet, per topic: a crash "
        "of a volatile broker loses about this much. Global: not filtered by job or version.",
        "s", 6, _query("A", "max by (topic) (kappa_archive_lag_seconds)", BY_TOPIC))
        .thresholds(_thresholds((None, "green"), (10, "orange"), (60, "red"))))
    size = (_stat(
        first_id + 2, TITLES[2], "Segments and bytes the archive holds, per topic. Global: "
        "not filtered by job or version.", 6,
        _query("A", "sum by (topic) (kappa_archive_segments)", "segments " + BY_TOPIC,
               instant=True),
        _query("B", "sum by (topic) (kappa_archive_bytes)", "bytes " + BY_TOPIC, instant=True))
        .thresholds(_thresholds((None, "green")))
        .override_by_query("B", [dm.DynamicConfigValue(id_val="unit", value="bytes")]))
    headroom = (_timeseries(
        first_id + 3, TITLES[3], "Share of the records the broker holds that lie below the "
        "archive's end, the lowest partition per topic: under 10 % retention is about to take "
        "records the archive has not copied (alert KappaArchiveRetentionRisk), below 0 it has. "
        "Global: not filtered by job or version.", "percentunit", 6,
        _query("A", "min by (topic) (kappa_archive_retention_headroom_ratio)", BY_TOPIC))
        .min(-1).max(1)
        .thresholds(_thresholds((None, "red"), (0, "orange"), (0.1, "green"))))
    return [behind, age, size, headroom]


def archive_row(row_id: int) -> dashboard_b.Row:
    return dashboard_b.Row(ROW_TITLE).id(row_id)
