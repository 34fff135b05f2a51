"""Runs: the state of each version's driver, changed only through ``states.transition()``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from orchestrator.catalog import events
from orchestrator.catalog.db import qualified
from orchestrator.errors import NotFoundError
from orchestrator.failpoints import fail_point
from orchestrator.models import DeployedVersion, RunRecord
from orchestrator.states import Expected, RunState, transition

_COLUMNS = ("version_id, state, attempt, pid, pid_started, host, app_id, log_path, reason, "
            "started_at, heartbeat_at, caught_up_at, busy_since, priority, queued_at")


def _from_row(row: tuple[Any, ...]) -> RunRecord:
    (vid, state, attempt, pid, pid_started, host, app_id, log_path, reason, started,
     heartbeat, caught_up, busy_since, priority, queued_at) = row
    return RunRecord(version_id=vid, state=RunState(state), attempt=attempt, pid=pid,
                     pid_started=pid_started, host=host, app_id=app_id, log_path=log_path,
                     reason=reason, started_at=started, heartbeat_at=heartbeat,
                     caught_up_at=caught_up, busy_since=busy_since, priority=priority,
                     queued_at=queued_at)


def create(conn: psycopg.Connection, schema: str, version_id: int) -> RunRecord:
    row = conn.execute(
        sql.SQL("INSERT INTO {} (version_id, state) VALUES (%s, %s) RETURNING " + _COLUMNS)
        .format(qualified(schema, "runs")), (version_id, RunState.REGISTERED.value)).fetchone()
    assert row is not None
    return _from_row(row)


def get(conn: psycopg.Connection, schema: str, version_id: int, *, for_update: bool = False
        ) -> RunRecord:
    query = "SELECT " + _COLUMNS + " FROM {} WHERE version_id = %s"
    if for_update:
        query += " FOR UPDATE"
    row = conn.execute(sql.SQL(query).format(qualified(schema, "runs")), (version_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no run for version id {version_id}: deploy the version first")
    return _from_row(row)


def change_state(conn: psycopg.Connection, schema: str, version: DeployedVersion,
                 target: RunState, *, expected: Expected, reason: str | None = None,
                 **changes: Any) -> RunRecord | None:
    """Move the run to ``target`` inside the caller's transaction, and log the event: the one
    place where a run's state changes.

    Only while the run is as ``expected`` (its attempt, and one of the states the change was
    decided in): a run that has moved since changes nothing and gives None. A driver replaced
    by a restart, or whose run a stop or a pause has left (perhaps from another host, which
    cannot signal it), learns so here and must stop; any other caller must look again.
    """
    current = get(conn, schema, version.id, for_update=True)
    if not expected.admits(current.attempt, current.state):
        return None
    if current.state == target and not changes:
        return current
    transition(current.state, target)
    assignments: list[sql.Composable] = [
        sql.SQL("state = %(state)s"), sql.SQL("reason = %(reason)s"), sql.SQL("updated_at = now()")
    ]
    params: dict[str, Any] = {"state": target.value, "reason": reason, "vid": version.id}
    for column, value in changes.items():
        assignments.append(sql.SQL("{} = %({})s").format(sql.Identifier(column),
                                                           sql.SQL(column)))
        params[column] = value
    if target == RunState.CAUGHT_UP:
        assignments.append(sql.SQL("caught_up_at = COALESCE(caught_up_at, now())"))
    row = conn.execute(
        sql.SQL("UPDATE {} SET {} WHERE version_id = %(vid)s RETURNING " + _COLUMNS).format(
            qualified(schema, "runs"), sql.SQL(", ").join(assignments)), params).fetchone()
    assert row is not None
    detail: dict[str, Any] = {"from": current.state.value, "to": target.value}
    if reason:
        detail["reason"] = reason
    if "attempt" in changes:
        detail["attempt"] = changes["attempt"]
    events.record(conn, schema, "state", job=version.job, version=version.version, **detail)
    return _from_row(row)


def change_states(conn: psycopg.Connection, schema: str, version: DeployedVersion,
                  targets: tuple[RunState, ...], **kwargs: Any) -> RunRecord | None:
    """:func:`change_state` to each of ``targets`` in turn, in the caller's transaction (no
    reader sees a state between); None as soon as one gives None."""
    done = None
    for target in targets:
        if done is not None:
            fail_point("driver.going_live")
        done = change_state(conn, schema, version, target, **kwargs)
        if done is None:
            break
    return done


def heartbeat(conn: psycopg.Connection, schema: str, version_id: int, attempt: int,
              busy_since: datetime | None = None) -> bool:
    """Record that the driver of ``attempt`` is alive, and since when it works on its current
    batch (None between batches); False if a restart replaced it or its run was stopped
    (perhaps from another host, which cannot signal it): it must exit."""
    active = [state.value for state in RunState if state.is_active]
    cur = conn.execute(
        sql.SQL("UPDATE {} SET heartbeat_at = now(), busy_since = %s WHERE version_id = %s "
                "AND attempt = %s AND state = ANY(%s)").format(qualified(schema, "runs")),
        (busy_since, version_id, attempt, active))
    return cur.rowcount == 1


def processed_offsets(conn: psycopg.Connection, schema: str, version_id: int
                      ) -> dict[str, dict[str, int]]:
    rows = conn.execute(
        sql.SQL("SELECT topic, partition, next_offset FROM {} WHERE version_id = %s "
                "ORDER BY topic, partition").format(qualified(schema, "processed_offsets")),
        (version_id,)).fetchall()
    result: dict[str, dict[str, int]] = {}
    for topic, partition, next_offset in rows:
        result.setdefault(topic, {})[str(partition)] = next_offset
    return result


def quarantine_batch(conn: psycopg.Connection, schema: str, version_id: int) -> int | None:
    """The batch that `kappa restart --quarantine` marked, if any."""
    row = conn.execute(sql.SQL("SELECT quarantine_batch FROM {} WHERE version_id = %s")
                       .format(qualified(schema, "runs")), (version_id,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def set_quarantine_batch(conn: psycopg.Connection, schema: str, version_id: int,
                         batch_id: int | None) -> None:
    conn.execute(sql.SQL("UPDATE {} SET quarantine_batch = %s WHERE version_id = %s")
                 .format(qualified(schema, "runs")), (batch_id, version_id))


def note_reason(conn: psycopg.Connection, schema: str, version_id: int, attempt: int,
                reason: str | None, *, while_active: bool = False) -> None:
    """Why a run makes no progress, without changing its state. ``while_active``: only while
    its driver is meant to run (a driver's own retry note), so that the reason of a run that
    was failed meanwhile (a restore that found it read lost records) is never overwritten."""
    active = [state.value for state in RunState if state.is_active or not while_active]
    conn.execute(sql.SQL("UPDATE {} SET reason = %s WHERE version_id = %s AND attempt = %s "
                         "AND state = ANY(%s)").format(qualified(schema, "runs")),
                 (reason, version_id, attempt, active))
