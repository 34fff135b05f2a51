"""Output and dead-letter tables of a version, in the data schema."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from orchestrator.catalog.db import qualified
from orchestrator.models import OUTPUT_TYPES, JobSpec
from orchestrator.naming import stage_table

DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "timestamp_ms", "key", "raw", "error")
# Columns of a stage table beside the output columns: the delete mark, and which write (one per
# batch run), task and task attempt wrote the row, so that a commit takes each task's rows once.
STAGE_COLUMNS = ("_delete", "_write", "_task", "_attempt")
# Each row's A/B bucket, computed by PostgreSQL when the row is written, so that a split's view
# compares an integer rather than hashing every row it reads (an md5 per row made a full scan
# through a 10 % split five to twelve times the scan of one table). A user's column cannot take
# the name: names start with a letter. Only for keys whose text no setting changes: a
# timestamptz's follows TimeZone (PostgreSQL refuses it), and a double precision's follows
# extra_float_digits (PostgreSQL accepts it: its output function is marked immutable), so a
# bucket stored under the writer's setting could differ from one a reader's session computes.
# The rows store what the catalog's key_bucket() computed: it must never change.
BUCKET_COLUMN = "_kappa_bucket"
_BUCKET_KEY_TYPES = frozenset(OUTPUT_TYPES) - {"timestamptz", "double precision"}


def _key_text(key_columns: Sequence[str], qualifier: str | None = None) -> sql.Composable:
    """A key as the split hashes it: its columns' text, joined by U+001F (key columns are NOT
    NULL, so no part is lost)."""
    def column(name: str) -> sql.Composable:
        named = sql.Identifier(name) if qualifier is None else sql.Identifier(qualifier, name)
        return sql.SQL("{}::text").format(named)
    return sql.SQL(" || E'\\x1f' || ").join(column(k) for k in key_columns)


def bucket_of(catalog_schema: str, key_columns: Sequence[str], qualifier: str | None = None
              ) -> sql.Composed:
    """The catalog's bucket of a key: the stored column's expression, and the view's for a
    table without it."""
    return sql.SQL("{}.key_bucket({})").format(sql.Identifier(catalog_schema),
                                               _key_text(key_columns, qualifier))


def stores_bucket(spec: JobSpec) -> bool:
    kinds = dict(spec.output_schema)
    return all(kinds.get(k) in _BUCKET_KEY_TYPES for k in spec.key_columns)


def tables_storing_bucket(conn: psycopg.Connection, data_schema: str, tables: Sequence[str]
                          ) -> set[str]:
    """Which of ``tables`` have the bucket column (tables made before it have not)."""
    rows = conn.execute(
        "SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND c.relname = ANY(%s) AND a.attname = %s AND NOT a.attisdropped",
        (data_schema, list(tables), BUCKET_COLUMN)).fetchall()
    return {r[0] for r in rows}


def create_tables(conn: psycopg.Connection, catalog_schema: str, data_schema: str, spec: JobSpec,
                  output_table: str, dead_letter_table: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(data_schema)))
    # Types come from the allow-list in models.OUTPUT_TYPES, checked when the job file was read.
    columns = [sql.SQL("{} {} NOT NULL" if name in spec.key_columns else "{} {}")
               .format(sql.Identifier(name), sql.SQL(kind)) for name, kind in spec.output_schema]
    if stores_bucket(spec):
        columns.append(sql.SQL("{} integer GENERATED ALWAYS AS ({}) STORED").format(
            sql.Identifier(BUCKET_COLUMN), bucket_of(catalog_schema, spec.key_columns)))
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
        qualified(data_schema, output_table), sql.SQL(", ").join(columns),
        sql.SQL(", ").join(map(sql.Identifier, spec.key_columns))))
    conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (topic text NOT NULL, partition integer NOT NULL, "
        "\"offset\" bigint NOT NULL, timestamp_ms bigint, key bytea, raw bytea, "
        "error text NOT NULL, log_epoch integer NOT NULL DEFAULT 0, "
        "PRIMARY KEY (topic, partition, \"offset\", log_epoch))"
    ).format(qualified(data_schema, dead_letter_table)))
    create_stage(conn, data_schema, spec)


def upgrade_dead_letters(conn: psycopg.Connection, data_schema: str, dead_letter_table: str
                         ) -> None:
    """Key a dead-letter table made before log epochs by (topic, partition, offset, log_epoch),
    so that a new log's dead letters at the old log's offsets are kept. Once per table."""
    table = qualified(data_schema, dead_letter_table)
    conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS log_epoch integer NOT NULL "
                         "DEFAULT 0").format(table))
    row = conn.execute(
        "SELECT c.conname, 'log_epoch' = ANY(ARRAY(SELECT a.attname FROM pg_attribute a "
        "WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey))) FROM pg_constraint c "
        "WHERE c.conrelid = to_regclass(%s) AND c.contype = 'p'",
        (table.as_string(conn),)).fetchone()
    if row is not None and not row[1]:
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}, ADD PRIMARY KEY "
                             "(topic, partition, \"offset\", log_epoch)").format(
            table, sql.Identifier(row[0])))


def create_stage(conn: psycopg.Connection, data_schema: str, spec: JobSpec) -> None:
    """The version's stage table. Unlogged, and without the output's constraints, so that a
    bad row (a null key, say) fails the batch's commit with a clear message, not a task."""
    columns = [sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
               for name, kind in spec.output_schema]
    conn.execute(sql.SQL(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {} ({}, _delete boolean NOT NULL DEFAULT false, "
        "_write text NOT NULL, _task integer NOT NULL, _attempt bigint NOT NULL)"
    ).format(qualified(data_schema, stage_table(spec.name, spec.version)),
             sql.SQL(", ").join(columns)))


def estimate_rows(conn: psycopg.Connection, data_schema: str, table: str) -> int | None:
    """Rows in ``table`` without a scan. The statistics' live-tuple count follows every commit;
    the planner's estimate (``reltuples``) waits for an ANALYZE, so it only stands in when the
    statistics were reset (a crash of PostgreSQL) and the count reads 0."""
    row = conn.execute(sql.SQL(
        "SELECT c.reltuples::bigint, s.n_live_tup FROM pg_class c "
        "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = to_regclass(%s)"
    ), (f'"{data_schema}"."{table}"',)).fetchone()
    if row is None:
        return None
    planned, live = row
    if live is not None and (live > 0 or planned is None or planned < 0):
        return int(live)
    return int(planned) if planned is not None and planned >= 0 else None


def count_rows(conn: psycopg.Connection, data_schema: str, table: str) -> int | None:
    row = conn.execute(
        sql.SQL("SELECT to_regclass(%s) IS NOT NULL"), (f'"{data_schema}"."{table}"',)
    ).fetchone()
    if not row or not row[0]:
        return None
    counted = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        qualified(data_schema, table))).fetchone()
    return int(counted[0]) if counted else None
