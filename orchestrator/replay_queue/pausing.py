"""Live first in the catalog: the agent's look that holds the replay queue while a live version
is too far behind, and pauses catch-ups into it (the rules: live_first.py).

A pause is an ordinary stop: the driver is stopped while its run is locked, so that it records
nothing more, and the run goes back to the queue with its priority and its place, its reason
and an event saying which live version was how far behind. It resumes from its checkpoint,
started by the queue like any queued version, once the hold has ended. The look runs under the
queue's lock: two agents never pause for the same reason twice."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from orchestrator.catalog import events, runs, versions
from orchestrator.catalog.access import CatalogAccess
from orchestrator.models import VersionLag
from orchestrator.replay_queue import queries as queue
from orchestrator.replay_queue.live_first import LiveLag, decide, lets_go_at
from orchestrator.spark.launch import launcher
from orchestrator.states import RunState

log = logging.getLogger("kappa.queue")

# A hold lasts this many of the agent's samples unless renewed: an agent that died lets go.
_RENEWALS_KEPT = 10
_MIN_HOLD_S = 30.0


def protect_live(catalog: CatalogAccess, lags: Sequence[VersionLag], interval_s: float
                 ) -> bool:
    """One look with the lags just measured; whether the queue is held after it (each pause
    is logged and recorded as an event)."""
    s = catalog.settings
    schema, limit = s.catalog_schema, s.live_lag_limit_s
    live = [LiveLag(lag.job, lag.version, lag.lag_seconds) for lag in lags
            if lag.run_state == RunState.LIVE]
    with catalog.connection() as conn, conn.transaction():
        queue.lock_queue(conn, schema)
        if limit is None:
            queue.end_hold(conn, schema)
            return False
        current = queue.current_hold(conn, schema)
        decision = decide(live, limit, held=current is not None,
                          since_last_pause_s=current.since_last_pause_s if current else None,
                          catching_up=queue.holding_slots(conn, schema))
        reason = decision.reason(limit) or (current.reason if current else None)
        if not decision.hold or reason is None:
            if queue.end_hold(conn, schema):
                events.record(conn, schema, "replay_hold_ended", reason=(
                    f"every live version is under {lets_go_at(limit):g}s behind (a quarter "
                    f"of live_lag_protect_s={limit:g}): catch-ups start again"))
            return False
        queue.renew_hold(conn, schema, reason, max(_MIN_HOLD_S, _RENEWALS_KEPT * interval_s))
        if current is None:
            behind = decision.behind
            events.record(conn, schema, "replay_hold", job=behind.job if behind else None,
                          version=behind.version if behind else None,
                          reason=f"{reason}: no catch-up starts")
        version_id = queue.pause_candidate(conn, schema) if decision.pause else None
        if version_id is None:
            return True
        version = versions.by_id(conn, schema, version_id)
        run = runs.get(conn, schema, version_id, for_update=True)
        launcher.stop_driver(run)  # under the run's lock: it records nothing more
        runs.change_state(conn, schema, version, RunState.QUEUED, expected=run.as_seen(),
                          reason=f"paused by live first: {reason}; it resumes from its "
                                 "checkpoint once every live version is back under "
                                 f"{lets_go_at(limit):g}s",
                          queued_at=run.queued_at or run.started_at or datetime.now(UTC))
        queue.note_pause(conn, schema)
        events.record(conn, schema, "paused", job=version.job, version=version.version,
                      reason=reason, attempt=run.attempt)
    log.info("paused %s %s: %s", version.job, version.version, reason)
    return True
