"""The replay queue in the catalog: the runs waiting for a slot, the catch-ups holding one, and
the advisory locks that make one process at a time hand slots out.

A slot is held by a run that is starting or replaying and has never caught up: a live version
that restarts and reads its backlog again holds none. A run the queue started keeps its
``queued_at``; while the process that took its slot has not yet recorded the driver's PID, that
process holds the run's claim lock, so a lock that anyone can take means that process died.
While a live version is too far behind, the agent holds the queue (``replay_hold``): no
catch-up starts, and catch-ups are paused back into it (pausing.py)."""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg import sql

from orchestrator.catalog.db import qualified
from orchestrator.models import QueueKeeper, ReplayHold

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


def holders(conn: psycopg.Connection, schema: str) -> list[int]:
    """The ids of the versions whose runs hold a slot."""
    rows = conn.execute(sql.SQL("SELECT r.version_id FROM {} r WHERE " + _HOLDING)
                        .format(qualified(schema, "runs"))).fetchall()
    return [int(r[0]) for r in rows]


def next_in_line(conn: psycopg.Connection, schema: str, limit: int | None) -> list[int]:
    """The queued versions' ids in the order they get slots: priority, then age."""
    rows = conn.execute(
        sql.SQL("SELECT version_id FROM {} WHERE state = 'queued' "
                "ORDER BY priority DESC, queued_at, version_id LIMIT %s")
        .format(qualified(schema, "runs")), (limit,)).fetchall()
    return [int(r[0]) for r in rows]


def outranked(conn: psycopg.Connection, schema: str, version_id: int, priority: int,
              queued_at: datetime) -> bool:
    """Whether another queued version comes before one of ``priority`` that joined the queue at
    ``queued_at``."""
    row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE state = 'queued' AND "
                               "version_id <> %s AND (priority > %s OR (priority = %s AND "
                               "queued_at <= %s)))").format(qualified(schema, "runs")),
                       (version_id, priority, priority, queued_at)).fetchone()
    return bool(row and row[0])


def pause_candidate(conn: psycopg.Connection, schema: str) -> int | None:
    """The catch-up that live first pauses: of the lowest priority, then the last to join, and
    whose driver was launched (one being launched right now is its claimer's)."""
    row = conn.execute(
        sql.SQL("SELECT version_id FROM {} r WHERE " + _HOLDING + " AND r.pid IS NOT NULL "
                "ORDER BY r.priority, COALESCE(r.queued_at, r.started_at) DESC, "
                "r.version_id DESC LIMIT 1").format(qualified(schema, "runs"))).fetchone()
    return None if row is None else int(row[0])


def current_hold(conn: psycopg.Connection, schema: str) -> ReplayHold | None:
    """The live-first hold on the queue, unless none was renewed in time."""
    row = conn.execute(
        sql.SQL("SELECT reason, since, EXTRACT(EPOCH FROM now() - last_pause_at)::float8 "
                "FROM {} WHERE renewed_until > now()").format(qualified(schema, "replay_hold"))
    ).fetchone()
    return None if row is None else ReplayHold(str(row[0]), row[1], row[2])


def renew_hold(conn: psycopg.Connection, schema: str, reason: str, for_s: float) -> None:
    """Hold the queue for ``for_s`` more seconds; a hold that had lapsed starts afresh."""
    conn.execute(
        sql.SQL("INSERT INTO {0} AS h (reason, renewed_until) VALUES (%s, now() + %s * "
                "interval '1 second') ON CONFLICT (id) DO UPDATE SET reason = EXCLUDED.reason, "
                "renewed_until = EXCLUDED.renewed_until, since = CASE WHEN h.renewed_until > "
                "now() THEN h.since ELSE now() END, last_pause_at = CASE WHEN h.renewed_until "
                "> now() THEN h.last_pause_at END").format(qualified(schema, "replay_hold")),
        (reason, for_s))


def note_pause(conn: psycopg.Connection, schema: str) -> None:
    conn.execute(sql.SQL("UPDATE {} SET last_pause_at = now()")
                 .format(qualified(schema, "replay_hold")))


def end_hold(conn: psycopg.Connection, schema: str) -> bool:
    """End the hold; whether one was in force."""
    row = conn.execute(sql.SQL("WITH ended AS (DELETE FROM {} RETURNING renewed_until > now() "
                               "AS live) SELECT bool_or(live) FROM ended")
                       .format(qualified(schema, "replay_hold"))).fetchone()
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


def note_look(conn: psycopg.Connection, schema: str, keeper: str, every_s: float) -> None:
    """Note that ``keeper``, which looks every ``every_s`` seconds, handed out slots now."""
    table = qualified(schema, "queue_keepers")
    conn.execute(sql.SQL("INSERT INTO {} (keeper, every_s) VALUES (%s, %s) ON CONFLICT (keeper) "
                         "DO UPDATE SET every_s = EXCLUDED.every_s, looked_at = now()")
                 .format(table), (keeper, every_s))
    conn.execute(sql.SQL("DELETE FROM {} WHERE looked_at < now() - interval '1 day'")
                 .format(table))


def keepers(conn: psycopg.Connection, schema: str) -> list[QueueKeeper]:
    """Every process that noted a look in the last day, the most recent first."""
    rows = conn.execute(
        sql.SQL("SELECT keeper, every_s, EXTRACT(EPOCH FROM now() - looked_at)::float8 FROM {} "
                "ORDER BY looked_at DESC, keeper").format(qualified(schema, "queue_keepers"))
    ).fetchall()
    return [QueueKeeper(str(k), float(e), max(0.0, float(a))) for k, e, a in rows]
