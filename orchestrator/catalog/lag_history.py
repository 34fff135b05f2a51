"""Lag samples and the last judged lag state of each version."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from orchestrator.catalog import events
from orchestrator.catalog.db import qualified
from orchestrator.lag import LagSample, LagState
from orchestrator.models import DeployedVersion

KEEP = timedelta(hours=1)


def add_sample(conn: psycopg.Connection, schema: str, version_id: int, sample: LagSample
               ) -> None:
    at = datetime.fromtimestamp(sample.at, UTC)
    conn.execute(sql.SQL(
        "INSERT INTO {} (version_id, at, processed, log_end, lag_seconds, driver_alive) "
        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING").format(
        qualified(schema, "lag_samples")),
        (version_id, at, sample.processed, sample.log_end, sample.lag_seconds,
         sample.driver_alive))
    conn.execute(sql.SQL("DELETE FROM {} WHERE version_id = %s AND at < %s").format(
        qualified(schema, "lag_samples")), (version_id, at - KEEP))


def recent_samples(conn: psycopg.Connection, schema: str, version_id: int, seconds: float
                   ) -> list[LagSample]:
    """Samples of the last ``seconds``, plus the one before them, oldest first."""
    rows = conn.execute(sql.SQL(
        "(SELECT at, processed, log_end, lag_seconds, driver_alive FROM {t} "
        " WHERE version_id = %(v)s AND at >= now() - make_interval(secs => %(s)s)) "
        "UNION ALL (SELECT at, processed, log_end, lag_seconds, driver_alive FROM {t} "
        " WHERE version_id = %(v)s AND at < now() - make_interval(secs => %(s)s) "
        " ORDER BY at DESC LIMIT 1) ORDER BY at").format(t=qualified(schema, "lag_samples")),
        {"v": version_id, "s": seconds}).fetchall()
    return [LagSample(at.timestamp(), processed, log_end, lag_s, alive)
            for at, processed, log_end, lag_s, alive in rows]


def fresh_samples(conn: psycopg.Connection, schema: str, job: str, versions: list[str], *,
                  active: list[str], max_age_s: float) -> dict[str, LagSample]:
    """Per version of ``versions`` whose run is in an ``active`` state: its newest sample taken
    at most ``max_age_s`` ago and since the run started (a sample of an earlier run says nothing
    about this one). One statement, whatever the number of versions."""
    rows = conn.execute(sql.SQL(
        "SELECT v.version, s.at, s.processed, s.log_end, s.lag_seconds, s.driver_alive "
        "FROM {versions} v JOIN {runs} r ON r.version_id = v.id "
        "CROSS JOIN LATERAL (SELECT * FROM {samples} x WHERE x.version_id = v.id "
        "  AND x.at >= now() - make_interval(secs => %(age)s) "
        "  AND (r.started_at IS NULL OR x.at >= r.started_at) "
        "  ORDER BY x.at DESC LIMIT 1) s "
        "WHERE v.job = %(job)s AND v.version = ANY(%(versions)s) "
        "AND r.state = ANY(%(active)s)").format(
        versions=qualified(schema, "job_versions"), runs=qualified(schema, "runs"),
        samples=qualified(schema, "lag_samples")),
        {"age": max_age_s, "job": job, "versions": versions, "active": active}).fetchall()
    return {version: LagSample(at.timestamp(), processed, log_end, lag_s, alive)
            for version, at, processed, log_end, lag_s, alive in rows}


def record_state(conn: psycopg.Connection, schema: str, version: DeployedVersion,
                 state: LagState, **detail: object) -> bool:
    """Store the judged state; log an event and return True when it changed."""
    row = conn.execute(sql.SQL("SELECT state FROM {} WHERE version_id = %s FOR UPDATE").format(
        qualified(schema, "lag_states")), (version.id,)).fetchone()
    if row is not None and row[0] == state.value:
        return False
    conn.execute(sql.SQL(
        "INSERT INTO {} (version_id, state, since) VALUES (%s, %s, now()) "
        "ON CONFLICT (version_id) DO UPDATE SET state = EXCLUDED.state, since = now()").format(
        qualified(schema, "lag_states")), (version.id, state.value))
    change: dict[str, Any] = {"from": row[0] if row else None, "to": state.value, **detail}
    events.record(conn, schema, "lag_state", job=version.job, version=version.version, **change)
    return True
