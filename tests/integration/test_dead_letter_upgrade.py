"""A dead-letter table made before log epochs is keyed by them at the driver's next start,
keeping its rows, and the upgrade is a no-op the second time."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

pytestmark = [pytest.mark.integration]


def _primary_key(conn: psycopg.Connection, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT a.attname FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid "
        "AND a.attnum = ANY(c.conkey) WHERE c.conrelid = to_regclass(%s) AND c.contype = 'p' "
        "ORDER BY array_position(c.conkey, a.attnum)", (table,)).fetchall()
    return [r[0] for r in rows]


def test_an_old_dead_letter_table_is_keyed_by_log_epoch(settings) -> None:
    from orchestrator.catalog.output import upgrade_dead_letters

    schema, table = settings.data_schema, "old_job__v1__dead_letters"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL(
            "CREATE TABLE {}.{} (topic text NOT NULL, partition integer NOT NULL, "
            "\"offset\" bigint NOT NULL, timestamp_ms bigint, key bytea, raw bytea, "
            "error text NOT NULL, PRIMARY KEY (topic, partition, \"offset\"))").format(
            sql.Identifier(schema), sql.Identifier(table)))
        conn.execute(sql.SQL("INSERT INTO {}.{} (topic, partition, \"offset\", error) "
                             "VALUES ('t', 0, 7, 'bad')").format(sql.Identifier(schema),
                                                                 sql.Identifier(table)))
        for _ in range(2):
            upgrade_dead_letters(conn, schema, table)
            assert _primary_key(conn, f'"{schema}"."{table}"') == \
                ["topic", "partition", "offset", "log_epoch"]
        conn.execute(sql.SQL("INSERT INTO {}.{} (topic, partition, \"offset\", error, log_epoch) "
                             "VALUES ('t', 0, 7, 'bad in the new log', 1)").format(
            sql.Identifier(schema), sql.Identifier(table)))
        rows = conn.execute(sql.SQL("SELECT log_epoch, error FROM {}.{} ORDER BY 1").format(
            sql.Identifier(schema), sql.Identifier(table))).fetchall()
    assert rows == [(0, "bad"), (1, "bad in the new log")]
