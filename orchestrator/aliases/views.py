"""The alias view: two UNION ALL branches per version (it serves every key; it serves some),
each gated by the routing row.

The view is (re)defined only when the set of versions changes (a deploy, a retire, or a promote to
a version whose columns differ). That DDL takes an ACCESS EXCLUSIVE lock, which waits for open
reader transactions and queues new readers behind it; so every attempt is bounded by
``lock_timeout`` and retried, and a switch between versions already in the view needs no DDL.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import psycopg
from psycopg import sql

from orchestrator.aliases import columns
from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError
from orchestrator.models import DeployedVersion
from orchestrator.naming import validate_name

LOCK_TIMEOUT_MS = 500
ATTEMPTS = 40


def _key_text(keys: Sequence[str]) -> sql.Composable:
    parts = [sql.SQL("t.{}::text").format(sql.Identifier(k)) for k in keys]
    if len(parts) == 1:
        return parts[0]
    return sql.SQL("concat_ws(E'\\x1f', {})").format(sql.SQL(", ").join(parts))


def view_query(catalog_schema: str, data_schema: str, alias: str,
               versions: Sequence[DeployedVersion], version_column: str | None = None
               ) -> sql.Composed:
    """One branch per version, ``versions[0]`` the primary (see columns.py for the columns a
    branch without one gives NULL); ``version_column``: a last column naming the version that
    serves the row."""
    spec = versions[0].spec
    view_columns = columns.shape(versions)
    named = None if version_column is None else sql.Identifier(
        validate_name(version_column, "alias_version_column"))

    def selected(v: DeployedVersion) -> sql.Composable:
        own = dict(v.spec.output_schema)
        parts = [sql.SQL("NULL::{} AS {}").format(sql.SQL(kind), sql.Identifier(c))
                 if c not in own else sql.SQL("t.{}").format(sql.Identifier(c))
                 if own[c] == kind else sql.SQL("t.{}::text AS {}").format(sql.Identifier(c),
                                                                          sql.Identifier(c))
                 for c, kind in view_columns]
        if named is not None:
            parts.append(sql.SQL("{}::text AS {}").format(sql.Literal(v.version), named))
        return sql.SQL(", ").join(parts)

    # The routing row is read once per statement (a materialized CTE); each branch is gated on
    # it by a condition without a column of the table, which PostgreSQL evaluates once, before
    # the scan (a One-Time Filter): a branch that serves nothing is never scanned, and while one
    # version serves every key its rows pass with no bucket computed.
    routing = sql.SQL(
        "WITH r AS MATERIALIZED (SELECT primary_version, candidate_version, percent FROM {} "
        "WHERE name = {}) ").format(qualified(catalog_schema, "aliases"), sql.Literal(alias))
    bucket = sql.SQL("{}.key_bucket({})").format(sql.Identifier(catalog_schema),
                                                 _key_text(spec.key_columns))
    branches = []
    for v in versions:
        table, version = qualified(data_schema, v.output_table), sql.Literal(v.version)
        branches.append(sql.SQL(
            "SELECT {columns} FROM {table} AS t WHERE EXISTS (SELECT FROM r WHERE "
            "r.candidate_version IS NULL AND r.primary_version = {version})"
        ).format(columns=selected(v), table=table, version=version))
        branches.append(sql.SQL(
            "SELECT {columns} FROM {table} AS t WHERE EXISTS (SELECT FROM r WHERE "
            "r.candidate_version IS NOT NULL AND {version} IN (r.primary_version, "
            "r.candidate_version)) AND CASE WHEN {bucket} < (SELECT percent FROM r) THEN "
            "(SELECT candidate_version FROM r) ELSE (SELECT primary_version FROM r) END = "
            "{version}"
        ).format(columns=selected(v), table=table, version=version, bucket=bucket))
    return routing + sql.SQL(" UNION ALL ").join(branches)


def define_view(conn: psycopg.Connection, *, catalog_schema: str, data_schema: str,
                serving_schema: str, reader_role: str, alias: str,
                versions: Sequence[DeployedVersion], version_column: str | None = None) -> None:
    """(Re)define the view inside the caller's transaction, with bounded lock waits.

    CREATE OR REPLACE keeps the grants, and can only append columns: when the view's columns
    change otherwise, it is dropped and created (grants are given again in the same
    transaction)."""
    view = qualified(serving_schema, alias)
    body = view_query(catalog_schema, data_schema, alias, versions, version_column)
    wanted = [c for c, _ in columns.shape(versions)] + ([version_column] if version_column
                                                          else [])
    existing = [r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
        "table_name = %s ORDER BY ordinal_position", (serving_schema, alias))]
    replace_columns = bool(existing) and wanted[:len(existing)] != existing
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with conn.transaction():  # a savepoint: a lock timeout undoes only this attempt
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
                    sql.Literal(f"{LOCK_TIMEOUT_MS}ms")))
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                    sql.Identifier(serving_schema)))
                if replace_columns:
                    conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(view))
                conn.execute(sql.SQL("CREATE OR REPLACE VIEW {} AS ").format(view) + body)
                grant_readers(conn, serving_schema, reader_role, alias)
                conn.execute(sql.SQL("SET LOCAL lock_timeout = 0"))
            return
        except psycopg.errors.LockNotAvailable:
            time.sleep(min(0.05 * attempt, 0.5))
        except psycopg.errors.InvalidTableDefinition:
            if replace_columns:
                raise
            replace_columns = True  # a column of the same name changed its type
    raise KappaError(
        f"could not redefine {serving_schema}.{alias}: readers kept it locked through "
        f"{ATTEMPTS} attempts of {LOCK_TIMEOUT_MS} ms; retry when long reader transactions end"
    )


def grant_readers(conn: psycopg.Connection, serving_schema: str, reader_role: str,
                  alias: str) -> None:
    role = sql.Identifier(reader_role)
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (reader_role,)).fetchone()
    if not exists:
        try:
            with conn.transaction():
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(role))
        except psycopg.errors.DuplicateObject:
            pass  # created meanwhile by another kappa
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
        sql.Identifier(serving_schema), role))
    conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
        qualified(serving_schema, alias), role))
