"""Numbered migrations of the catalog schema, applied automatically and exactly once."""

from __future__ import annotations

import re
from importlib import resources

import psycopg
from psycopg import sql

_FILE = re.compile(r"(\d{3})_[a-z0-9_]+\.sql")
# Any constant works; it only has to be the same in every kappa process.
_LOCK_KEY = 0x6B61707061


def available() -> list[tuple[int, str, str]]:
    files = resources.files("orchestrator.catalog").joinpath("migrations")
    found = []
    for entry in files.iterdir():
        match = _FILE.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found)


def migrate(conn: psycopg.Connection, schema: str) -> list[int]:
    """Bring the catalog schema up to date; return the migration numbers applied now."""
    applied_now: list[int] = []
    with conn.transaction():
        # Two CLIs starting at once must not both run the same migration.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.schema_migrations "
            "(number integer PRIMARY KEY, name text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(sql.Identifier(schema)))
        done = {row[0] for row in conn.execute(
            sql.SQL("SELECT number FROM {}.schema_migrations").format(sql.Identifier(schema))
        )}
        for number, name, text in available():
            if number in done:
                continue
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
            conn.execute(text.encode())
            conn.execute(
                sql.SQL("INSERT INTO {}.schema_migrations (number, name) VALUES (%s, %s)")
                .format(sql.Identifier(schema)), (number, name))
            applied_now.append(number)
    return applied_now
