"""The replay queue in the catalog: the runs waiting for a slot, the catch-ups holding one, and
the advisory locks that make one process at a time hand slots out.

A slot is held by a run that is starting or replaying and has never caught up: a live version
that restarts and reads its backlog again holds none. A run the queue started keeps its
``queued_at``; while the process that took its slot has not yet recorded the driver's PID, that
process holds the run's claim lock, so a lock that anyone can take means that process died."""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg import sql

from orchestrator.catalog.db import qualified

_HOLDING = "r.state IN ('starting', 'replaying') AND r.caught_up_at IS NULL"


def lock_queue(conn: psycopg.Connection, schema: str) -> None:
    """Until the caller's transaction ends, no other process hands out this catalog's slots."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), 0)", (f"{schema}.replay_queue",))


def hold_claim(conn: psycopg.Connection, schema: str, version_id: int) -> None:
    """Held by this session until ``release_claim``, or until this process dies."""
    conn.execute("SELECT pg_advisory_lock(hashtext(%s), %s)", (f"{schema}.claims", version_id))


def release_claim(conn: psycopg.Connection, schema: str, version_id: int) -> None:
    conn.execute("SELECT pg_advisory_unlock(hashtext(%s), %s)", (f"{schema}.claims", version_id))


def claimer_gone(conn: psycopg.Connection, schema: str, version_id: int) -> bool:
    """Whether no live session holds the run's claim lock (taken until the transaction ends)."""
    row = conn.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s), %s)",
                       (f"{schema}.claims", version_id)).fetchone()
    return bool(row and row[0])


def holding_slots(conn: psycopg.Connection, schema: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} r WHERE " + _HOLDING)
                       .format(qualified(schema, "runs"))).fetchone()
    return int(row[0]) if row else 0


def next_in_line(conn: psycopg.Connection, schema: str, limit: int | None) -> list[int]:
    """The queued versions' ids in the order they get slots: priority, then age."""
    rows = conn.execute(
        sql.SQL("SELECT version_id FROM {} WHERE state = 'queued' "
                "ORDER BY priority DESC, queued_at, version_id LIMIT %s")
        .format(qualified(schema, "runs")), (limit,)).fetchall()
    return [int(r[0]) for r in rows]


def outranked(conn: psycopg.Connection, schema: str, priority: int) -> bool:
    """Whether a queued version comes before a new one of ``priority``."""
    row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE state = 'queued' AND "
                               "priority >= %s)").format(qualified(schema, "runs")),
                       (priority,)).fetchone()
    return bool(row and row[0])


def unlaunched_claims(conn: psycopg.Connection, schema: str) -> list[int]:
    """Runs the queue started whose driver's PID was never recorded."""
    rows = conn.execute(
        sql.SQL("SELECT version_id FROM {} WHERE state = 'starting' AND pid IS NULL AND "
                "queued_at IS NOT NULL ORDER BY version_id").format(qualified(schema, "runs"))
    ).fetchall()
    return [int(r[0]) for r in rows]


def entries(conn: psycopg.Connection, schema: str
            ) -> list[tuple[str, str, str, int, datetime | None, datetime | None]]:
    """(job, version, state, priority, queued_at, started_at) of every catch-up holding a slot
    (oldest first), then of every queued version in its order."""
    rows = conn.execute(
        sql.SQL("SELECT v.job, v.version, r.state, r.priority, r.queued_at, r.started_at "
                "FROM {} r JOIN {} v ON v.id = r.version_id WHERE (" + _HOLDING + ") OR "
                "r.state = 'queued' ORDER BY r.state = 'queued', "
                "CASE WHEN r.state = 'queued' THEN -r.priority END, "
                "CASE WHEN r.state = 'queued' THEN r.queued_at ELSE r.started_at END, r.version_id")
        .format(qualified(schema, "runs"), qualified(schema, "job_versions"))).fetchall()
    return [(str(j), str(v), str(s), int(p), q, st) for j, v, s, p, q, st in rows]


def place_of(conn: psycopg.Connection, schema: str, version_id: int) -> tuple[int, int] | None:
    """(place, queue length) of a queued version; None if it is not queued."""
    row = conn.execute(
        sql.SQL("SELECT place, total FROM (SELECT version_id, row_number() OVER (ORDER BY "
                "priority DESC, queued_at, version_id) AS place, count(*) OVER () AS total "
                "FROM {} WHERE state = 'queued') q WHERE version_id = %s")
        .format(qualified(schema, "runs")), (version_id,)).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def counts(conn: psycopg.Connection, schema: str) -> tuple[int, int]:
    """(catch-ups holding a slot, versions queued)."""
    row = conn.execute(
        sql.SQL("SELECT count(*) FILTER (WHERE " + _HOLDING + "), count(*) FILTER (WHERE "
                "r.state = 'queued') FROM {} r").format(qualified(schema, "runs"))).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)
