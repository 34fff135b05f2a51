"""The append-only event log of everything the orchestrator did."""

from __future__ import annotations

import getpass
import os
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from orchestrator.catalog.db import qualified


def actor() -> str:
    """Who acted: the OS user, plus the Airflow run when an Airflow task calls us."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid:{os.getuid()}"
    run_id = os.environ.get("AIRFLOW_CTX_DAG_RUN_ID")
    return f"{user} (airflow {run_id})" if run_id else user


def record(conn: psycopg.Connection, schema: str, kind: str, *, job: str | None = None,
           version: str | None = None, who: str | None = None, **detail: Any) -> None:
    conn.execute(
        psycopg.sql.SQL(
            "INSERT INTO {} (actor, job, version, kind, detail) VALUES (%s, %s, %s, %s, %s)"
        ).format(qualified(schema, "events")),
        (who or actor(), job, version, kind, Jsonb(detail)),
    )


def list_events(conn: psycopg.Connection, schema: str, job: str | None = None,
                version: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
    """The newest ``limit`` events (of a job, of a version), newest first."""
    rows = conn.execute(
        psycopg.sql.SQL(
            "SELECT id, at, actor, job, version, kind, detail FROM {} "
            "WHERE (%(job)s::text IS NULL OR job = %(job)s) "
            "AND (%(version)s::text IS NULL OR version = %(version)s) "
            "ORDER BY id DESC LIMIT %(limit)s"
        ).format(qualified(schema, "events")),
        {"job": job, "version": version, "limit": limit},
    ).fetchall()
    keys = ("id", "at", "actor", "job", "version", "kind", "detail")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def prune(conn: psycopg.Connection, schema: str, keep: int) -> int:
    """Delete all but the ``keep`` newest events; return how many went. One walk of the
    primary key's newest ``keep`` entries."""
    table = qualified(schema, "events")
    with conn.transaction():
        # The log is append-only; its trigger lets retention, and only retention, delete.
        conn.execute("SET LOCAL kappa.retention = 'on'")
        return conn.execute(psycopg.sql.SQL(
            "DELETE FROM {t} WHERE id <= (SELECT id FROM {t} ORDER BY id DESC OFFSET %s LIMIT 1)"
        ).format(t=table), (max(0, keep),)).rowcount
