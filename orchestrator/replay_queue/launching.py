"""A version's driver started: its attempt claimed in the catalog, then the process launched.

Two steps, so that the replay queue can claim slots under its lock and launch after the commit
(slots.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from orchestrator.catalog import runs
from orchestrator.catalog.access import CatalogAccess
from orchestrator.errors import LaunchError
from orchestrator.models import DeployedVersion, RunRecord
from orchestrator.settings import Settings
from orchestrator.spark.launch import launcher
from orchestrator.states import Expected, RunState


def start_driver(catalog: CatalogAccess, conn: psycopg.Connection, version: DeployedVersion
                 ) -> RunRecord:
    with conn.transaction():
        # Not from the queue (a restart, a deploy's own start): nothing for it to take back.
        attempt = claim_attempt(conn, catalog.settings.catalog_schema, version, queued_at=None)
    return launch_claimed(catalog.settings, conn, version, attempt)


def claim_attempt(conn: psycopg.Connection, schema: str, version: DeployedVersion,
                  **changes: Any) -> int:
    """The run's next attempt, recorded as starting in the caller's transaction; its driver is
    launched after the commit (``launch_claimed``)."""
    run = runs.get(conn, schema, version.id, for_update=True)
    attempt = run.attempt + 1
    runs.change_state(conn, schema, version, RunState.STARTING, expected=run.as_seen(),
                      attempt=attempt, pid=None,
                      pid_started=None, app_id=None, heartbeat_at=None,
                      started_at=datetime.now(UTC), **changes)
    return attempt


def launch_claimed(s: Settings, conn: psycopg.Connection, version: DeployedVersion,
                   attempt: int) -> RunRecord:
    try:
        process = launcher.launch(s, version.job, version.version, attempt)
    except OSError as exc:
        with conn.transaction():
            runs.change_state(conn, s.catalog_schema, version, RunState.FAILED,
                              reason=f"could not launch the driver: {exc}",
                              expected=Expected.seen(attempt, RunState.STARTING))
        raise LaunchError(f"could not launch the driver of {version.job} "
                          f"{version.version}: {exc}; fix it, then `kappa restart "
                          f"{version.job} {version.version}`") from exc
    with conn.transaction():
        conn.execute(
            psycopg.sql.SQL("UPDATE {}.runs SET pid = %s, pid_started = %s, log_path = %s, "
                            "host = %s WHERE version_id = %s AND attempt = %s")
            .format(psycopg.sql.Identifier(s.catalog_schema)),
            (process.pid, process.started, str(process.log_path), launcher.this_host(),
             version.id, attempt))
        return runs.get(conn, s.catalog_schema, version.id)
