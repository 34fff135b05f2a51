"""The alias view: two UNION ALL branches per version (it serves every key; it serves some),
each gated by the routing row.

The view is (re)defined only when the set of versions changes (a deploy, a retire, or a promote to
a version whose columns differ). That DDL takes an ACCESS EXCLUSIVE lock, which waits for open
reader transactions and queues new readers behind it; so every attempt is bounded by
``lock_timeout`` and retried, and a switch between versions already in the view needs no DDL.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import psycopg
from psycopg import sql

from orchestrator.catalog import output
from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError
from orchestrator.models import DeployedVersion
from orchestrator.naming import validate_name
from orchestrator.serving import columns

LOCK_TIMEOUT_MS = 500
ATTEMPTS = 40
# The view's comment names the form of its query: a deploy redefines a view of an older form
# (the first had the routing row in a WITH), so that an upgrade reaches its readers.
FORM = "kappa alias view, form 2"


def view_query(catalog_schema: str, data_schema: str, alias: str,
               versions: Sequence[DeployedVersion], version_column: str | None = None,
               storing_bucket: Collection[str] = ()) -> sql.Composed:
    """One branch per version, ``versions[0]`` the primary (see columns.py for the columns a
    branch without one gives NULL); ``version_column``: a last column naming the version that
    serves the row; ``storing_bucket``: the tables whose rows carry their bucket."""
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

    # Each branch is gated by the routing row through scalar subqueries without a column of
    # the table: PostgreSQL runs each once per statement (an InitPlan), on the statement's one
    # snapshot, and tests the gate before the scan (a One-Time Filter). So a branch that serves
    # nothing is never scanned, and while one version serves every key no bucket is computed.
    # No CTE: it would keep the planner from one Parallel Append over the branches, and a
    # split branch alone would launch parallel workers even while its gate is false.
    routing = qualified(catalog_schema, "aliases")
    name = sql.Literal(alias)
    branches = []
    for v in versions:
        table, version = qualified(data_schema, v.output_table), sql.Literal(v.version)
        # Equal either way (output.py): a table made before the column hashes each row it reads.
        bucket = (sql.SQL("t.{}").format(sql.Identifier(output.BUCKET_COLUMN))
                  if v.output_table in storing_bucket
                  else output.bucket_of(catalog_schema, spec.key_columns, "t"))
        branches.append(sql.SQL(
            "SELECT {columns} FROM {table} AS t WHERE (SELECT r.candidate_version IS NULL AND "
            "r.primary_version = {version} FROM {routing} AS r WHERE r.name = {name})"
        ).format(columns=selected(v), table=table, version=version, routing=routing,
                 name=name))
        # Its keys in a split: buckets [0, percent) as the candidate, [percent, 100) as the
        # primary.
        branches.append(sql.SQL(
            "SELECT {columns} FROM {table} AS t WHERE (SELECT r.candidate_version IS NOT NULL "
            "AND {version} IN (r.primary_version, r.candidate_version) FROM {routing} AS r "
            "WHERE r.name = {name}) AND {bucket} <@ (SELECT CASE WHEN r.candidate_version = "
            "{version} THEN int4range(0, r.percent) ELSE int4range(r.percent, 100) END FROM "
            "{routing} AS r WHERE r.name = {name})"
        ).format(columns=selected(v), table=table, version=version, routing=routing,
                 name=name, bucket=bucket))
    return sql.SQL(" UNION ALL ").join(branches)


def define_view(conn: psycopg.Connection, *, catalog_schema: str, data_schema: str,
                serving_schema: str, reader_role: str, alias: str,
                versions: Sequence[DeployedVersion], version_column: str | None = None) -> None:
    """(Re)define the view inside the caller's transaction, with bounded lock waits.

    CREATE OR REPLACE keeps the grants, and can only append columns: when the view's columns
    change otherwise, it is dropped and created (grants are given again in the same
    transaction)."""
    view = qualified(serving_schema, alias)
    storing = output.tables_storing_bucket(conn, data_schema, [v.output_table for v in versions])
    body = view_query(catalog_schema, data_schema, alias, versions, version_column, storing)
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
                conn.execute(sql.SQL("COMMENT ON VIEW {} IS {}").format(view, sql.Literal(FORM)))
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


def outdated(conn: psycopg.Connection, serving_schema: str, alias: str) -> bool:
    """Whether the alias's view exists in a form older than this release's."""
    row = conn.execute(
        "SELECT obj_description(c.oid, 'pg_class') FROM pg_class c JOIN pg_namespace n ON "
        "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'v'",
        (serving_schema, alias)).fetchone()
    return row is not None and row[0] != FORM


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
