"""Output and dead-letter tables of a version, in the data schema."""

from __future__ import annotations

import psycopg
from psycopg import sql

from orchestrator.catalog.db import qualified
from orchestrator.models import JobSpec

DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "timestamp_ms", "key", "raw", "error")


def create_tables(conn: psycopg.Connection, data_schema: str, spec: JobSpec, output_table: str,
                  dead_letter_table: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(data_schema)))
    # Types come from the allow-list in models.OUTPUT_TYPES, checked when the job file was read.
    columns = [sql.SQL("{} {} NOT NULL" if name in spec.key_columns else "{} {}")
               .format(sql.Identifier(name), sql.SQL(kind)) for name, kind in spec.output_schema]
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
        qualified(data_schema, output_table), sql.SQL(", ").join(columns),
        sql.SQL(", ").join(map(sql.Identifier, spec.key_columns))))
    conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (topic text NOT NULL, partition integer NOT NULL, "
        "\"offset\" bigint NOT NULL, timestamp_ms bigint, key bytea, raw bytea, "
        "error text NOT NULL, PRIMARY KEY (topic, partition, \"offset\"))"
    ).format(qualified(data_schema, dead_letter_table)))


def count_rows(conn: psycopg.Connection, data_schema: str, table: str) -> int | None:
    row = conn.execute(
        sql.SQL("SELECT to_regclass(%s) IS NOT NULL"), (f'"{data_schema}"."{table}"',)
    ).fetchone()
    if not row or not row[0]:
        return None
    counted = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        qualified(data_schema, table))).fetchone()
    return int(counted[0]) if counted else None
