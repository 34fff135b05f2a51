"""The plans of a batch phase's tiles (#60): each tile's batch id and offsets, recorded before
anything of it is staged, so that a retry (in the same driver or the next attempt's) runs the
same tile and counts no read twice. The record is fenced on the run: a driver whose attempt was
replaced, or whose run left ``replaying`` (paused by live first, stopped), plans nothing more,
which makes such a pause a stop between two tiles."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.catalog.batches import StaleDriverError
from orchestrator.catalog.db import qualified
from orchestrator.models import DeployedVersion, Offsets
from orchestrator.states import RunState
from orchestrator.tiles import Tile


def planned(conn: psycopg.Connection, schema: str, version_id: int, batch_id: int
            ) -> Tile | None:
    """The recorded plan of batch ``batch_id``, if one was made and its batch not committed
    (the caller asks for the next batch id the catalog expects)."""
    row = conn.execute(
        sql.SQL("SELECT batch_id, start_offsets, end_offsets FROM {} WHERE version_id = %s "
                "AND batch_id = %s").format(qualified(schema, "tile_plans")),
        (version_id, batch_id)).fetchone()
    return None if row is None else Tile(int(row[0]), _offsets(row[1]), _offsets(row[2]))


def last_planned(conn: psycopg.Connection, schema: str, version_id: int) -> int | None:
    """The batch id of the version's newest tile plan (None: no batch phase planned one)."""
    row = conn.execute(sql.SQL("SELECT batch_id FROM {} WHERE version_id = %s").format(
        qualified(schema, "tile_plans")), (version_id,)).fetchone()
    return None if row is None else int(row[0])


def record(conn: psycopg.Connection, schema: str, version: DeployedVersion, attempt: int,
           tile: Tile) -> None:
    """Record ``tile`` as the version's plan, in the caller's transaction, once the run row
    (locked until the commit) shows this attempt still replaying."""
    run = conn.execute(
        sql.SQL("SELECT attempt, state FROM {} WHERE version_id = %s FOR UPDATE")
        .format(qualified(schema, "runs")), (version.id,)).fetchone()
    if run is None or run[0] != attempt:
        raise StaleDriverError(
            f"driver attempt {attempt} of {version.job} {version.version} was replaced "
            f"(current attempt {run[0] if run else None}); exiting")
    if run[1] != RunState.REPLAYING.value:
        raise StaleDriverError(
            f"{version.job} {version.version} is {run[1]}, no longer replaying: its batch phase "
            f"stops before batch {tile.batch_id}; `kappa status` says why")
    conn.execute(
        sql.SQL("INSERT INTO {} (version_id, batch_id, attempt, start_offsets, end_offsets) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (version_id) DO UPDATE SET "
                "batch_id = EXCLUDED.batch_id, attempt = EXCLUDED.attempt, "
                "start_offsets = EXCLUDED.start_offsets, end_offsets = EXCLUDED.end_offsets, "
                "planned_at = now()").format(qualified(schema, "tile_plans")),
        (version.id, tile.batch_id, attempt, Jsonb(tile.start), Jsonb(tile.end)))


def forget(conn: psycopg.Connection, schema: str, version_id: int) -> None:
    """Drop the version's plan (one past the log's end, that the log can no longer serve)."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE version_id = %s").format(
        qualified(schema, "tile_plans")), (version_id,))


def _offsets(value: object) -> Offsets:
    assert isinstance(value, dict)
    return {str(t): {str(p): int(o) for p, o in ps.items()} for t, ps in value.items()}
