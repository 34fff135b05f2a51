"""The dashboard's row for the archive of the log: how far behind the log it is, in records
and in seconds, and how many segments and bytes it holds, per topic.

Global panels: the archive is kept per topic (of the lineage the broker holds now), not per job
or version. Its figures come from the agent's exporter while the agent archives.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dm

ROW_TITLE = "Archive of the log"
TITLES = ("Archive lag (records)", "Archive lag (seconds)", "Archive size")
BY_TOPIC = "{{topic}}"


def archive_panels(first_id: int) -> list[cogbuilder.Builder[dm.Panel]]:
    from orchestrator.metrics.dashboard import _query, _stat, _thresholds, _timeseries

    behind = _timeseries(
        first_id, TITLES[0], "Records of the log not archived yet, per topic; 0 when the "
        "archive has reached the log end. Global: not filtered by job or version.", "short", 8,
        _query("A", "sum by (topic) (kappa_archive_lag_records)", BY_TOPIC))
    age = (_timeseries(
        first_id + 1, TITLES[1], "Age of the oldest record not archived yet, per topic: a crash "
        "of a volatile broker loses about this much. Global: not filtered by job or version.",
        "s", 8, _query("A", "max by (topic) (kappa_archive_lag_seconds)", BY_TOPIC))
        .thresholds(_thresholds((None, "green"), (10, "orange"), (60, "red"))))
    size = (_stat(
        first_id + 2, TITLES[2], "Segments and bytes the archive holds, per topic. Global: "
        "not filtered by job or version.", 8,
        _query("A", "sum by (topic) (kappa_archive_segments)", "segments " + BY_TOPIC,
               instant=True),
        _query("B", "sum by (topic) (kappa_archive_bytes)", "bytes " + BY_TOPIC, instant=True))
        .thresholds(_thresholds((None, "green")))
        .override_by_query("B", [dm.DynamicConfigValue(id_val="unit", value="bytes")]))
    return [behind, age, size]


def archive_row(row_id: int) -> dashboard_b.Row:
    return dashboard_b.Row(ROW_TITLE).id(row_id)
