"""Alias routing rows, their append-only history, and versions' latest validations."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.catalog.db import qualified
from orchestrator.routing import Routing


def lock(conn: psycopg.Connection, schema: str, alias: str) -> tuple[Routing, list[str]] | None:
    """The alias's routing and view versions, locked until the transaction ends (switches of
    one alias are serialised here)."""
    row = conn.execute(sql.SQL(
        "SELECT primary_version, candidate_version, percent, rollback_version, view_versions "
        "FROM {} WHERE name = %s FOR UPDATE").format(qualified(schema, "aliases")),
        (alias,)).fetchone()
    if row is None:
        return None
    primary, candidate, percent, rollback_to, view_versions = row
    return Routing(alias, primary, candidate, percent, rollback_to), list(view_versions)


def find(conn: psycopg.Connection, schema: str, alias: str) -> dict[str, Any] | None:
    row = conn.execute(sql.SQL(
        "SELECT name, job, serving_schema, primary_version, candidate_version, percent, "
        "rollback_version, view_versions, updated_at FROM {} WHERE name = %s").format(
        qualified(schema, "aliases")), (alias,)).fetchone()
    if row is None:
        return None
    keys = ("alias", "job", "serving_schema", "primary", "candidate", "percent", "rollback_to",
            "view_versions", "updated_at")
    return dict(zip(keys, row, strict=True))


def overview(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    """(job, alias, primary, candidate, percent, switches, rollback_to) for every alias."""
    return conn.execute(sql.SQL(
        "SELECT a.job, a.name, a.primary_version, a.candidate_version, a.percent, "
        "(SELECT count(*) FROM {h} h WHERE h.alias = a.name), a.rollback_version "
        "FROM {a} a ORDER BY a.name").format(
        a=qualified(schema, "aliases"), h=qualified(schema, "alias_history"))).fetchall()


def for_job(conn: psycopg.Connection, schema: str, job: str) -> list[str]:
    return [r[0] for r in conn.execute(sql.SQL("SELECT name FROM {} WHERE job = %s ORDER BY name")
                                       .format(qualified(schema, "aliases")), (job,))]


def create(conn: psycopg.Connection, schema: str, alias: str, job: str, serving_schema: str
           ) -> None:
    conn.execute(sql.SQL("INSERT INTO {} (name, job, serving_schema) VALUES (%s, %s, %s) "
                         "ON CONFLICT DO NOTHING").format(qualified(schema, "aliases")),
                 (alias, job, serving_schema))


def save(conn: psycopg.Connection, schema: str, routing: Routing,
         view_versions: list[str] | None = None) -> None:
    conn.execute(sql.SQL(
        "UPDATE {} SET primary_version = %s, candidate_version = %s, percent = %s, "
        "rollback_version = %s, view_versions = COALESCE(%s, view_versions), updated_at = now() "
        "WHERE name = %s").format(qualified(schema, "aliases")),
        (routing.primary, routing.candidate, routing.percent, routing.rollback_to,
         Jsonb(view_versions) if view_versions is not None else None, routing.alias))


def record_switch(conn: psycopg.Connection, schema: str, *, alias: str, job: str, actor: str,
                  action: str, before: Routing, after: Routing, reason: str | None,
                  forced: bool, lag: dict[str, Any]) -> None:
    target = after.candidate if action == "ab" else after.primary
    conn.execute(sql.SQL(
        "INSERT INTO {} (alias, job, actor, action, from_version, to_version, percent, reason, "
        "forced, lag) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)").format(
        qualified(schema, "alias_history")),
        (alias, job, actor, action, before.primary, target,
         after.percent if action == "ab" else 100, reason, forced, Jsonb(lag)))


def history(conn: psycopg.Connection, schema: str, job: str, alias: str | None
            ) -> list[dict[str, Any]]:
    rows = conn.execute(sql.SQL(
        "SELECT id, at, actor, alias, action, from_version, to_version, percent, reason, forced, "
        "lag FROM {} WHERE job = %(job)s AND (%(alias)s::text IS NULL OR alias = %(alias)s) "
        "ORDER BY id").format(qualified(schema, "alias_history")),
        {"job": job, "alias": alias}).fetchall()
    keys = ("id", "at", "who", "alias", "action", "from", "to", "percent", "reason", "forced",
            "lag")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def store_validation(conn: psycopg.Connection, schema: str, version_id: int, against: str,
                     passed: bool, report: dict[str, Any]) -> None:
    conn.execute(sql.SQL(
        "INSERT INTO {} (version_id, against, passed, report) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (version_id) DO UPDATE SET against = EXCLUDED.against, "
        "passed = EXCLUDED.passed, report = EXCLUDED.report, at = now()").format(
        qualified(schema, "validations")), (version_id, against, passed, Jsonb(report)))


def latest_validation(conn: psycopg.Connection, schema: str, version_id: int
                      ) -> tuple[str, bool, Any, dict[str, Any]] | None:
    """(against, passed, at, report) of the version's latest validation."""
    row = conn.execute(sql.SQL("SELECT against, passed, at, report FROM {} "
                               "WHERE version_id = %s")
                       .format(qualified(schema, "validations")), (version_id,)).fetchone()
    return (row[0], row[1], row[2], row[3]) if row else None
