"""The dashboard's row for the replay budget: catch-ups holding slots against the slots, and the
versions waiting in the queue, with live first's hold. Global panels: the budget is kept per
catalog, not per job."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dm

from orchestrator.metrics.dashboard_panels import query as _query
from orchestrator.metrics.dashboard_panels import thresholds as _thresholds
from orchestrator.metrics.dashboard_panels import timeseries as _timeseries

ROW_TITLE = "Replay budget"
TITLES = ("Replay slots", "Replay queue")


def budget_panels(first_id: int) -> list[cogbuilder.Builder[dm.Panel]]:
    slots = _timeseries(
        first_id, TITLES[0], "Catch-ups holding a replay slot, and the slots (replay_slots; no "
        "line without a budget). Live versions hold none. Global: not filtered by job or "
        "version.", "short", 12,
        _query("A", "max(kappa_replays_running)", "replaying"),
        _query("B", "max(kappa_replay_slots)", "slots"))
    queued = (_timeseries(
        first_id + 1, TITLES[1], "Versions waiting in the replay queue for a slot (kappa "
        "queue lists them with their waits and ETAs), and live first's hold: 1 while a live "
        "version is more than live_lag_protect_s behind, when no catch-up starts and catch-ups "
        "are paused into the queue. Global: not filtered by job or version.",
        "short", 12, _query("A", "max(kappa_replays_queued)", "queued"),
        _query("B", "max(kappa_replay_hold)", "held by live first"))
        .thresholds(_thresholds((None, "green"), (1, "orange"))))
    return [slots, queued]


def budget_row(row_id: int) -> dashboard_b.Row:
    return dashboard_b.Row(ROW_TITLE).id(row_id)
