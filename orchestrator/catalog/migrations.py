"""Numbered migrations of the catalog schema, applied automatically and exactly once."""

from __future__ import annotations

import re
from importlib import resources

import psycopg
from psycopg import sql

from orchestrator.errors import KappaError

_FILE = re.compile(r"(\d{3})_[a-z0-9_]+\.sql")
# Any constant works; it only has to be the same in every kappa process.
_LOCK_KEY = 0x6B61707061
LOCK_WAIT_S = 30  # a migration takes well under a second; a longer wait is a stuck holder


def available() -> list[tuple[int, str, str]]:
    files = resources.files("orchestrator.catalog").joinpath("migrations")
    found = []
    for entry in files.iterdir():
        match = _FILE.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found)


def migrate(conn: psycopg.Connection, schema: str) -> list[int]:
    """Bring the catalog schema up to date; return the migration numbers applied now.

    An up-to-date catalog is used without the migrations' lock, so a process stuck while it
    holds that lock stops no one else; a catalog that needs a migration waits for the lock at
    most ``LOCK_WAIT_S`` and then says which backend holds it."""
    if _applied(conn, schema) >= {number for number, _, _ in available()}:
        return []
    try:
        return _migrate_locked(conn, schema)
    except psycopg.errors.LockNotAvailable as exc:
        raise KappaError(_lock_held(conn)) from exc


def _applied(conn: psycopg.Connection, schema: str) -> set[int]:
    table = sql.SQL(".").join([sql.Identifier(schema), sql.Identifier("schema_migrations")])
    found = conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),)).fetchone()
    if found is None or found[0] is None:
        return set()
    return {row[0] for row in conn.execute(sql.SQL("SELECT number FROM {}").format(table))}


def _migrate_locked(conn: psycopg.Connection, schema: str) -> list[int]:
    applied_now: list[int] = []
    with conn.transaction():
        # Two CLIs starting at once must not both run the same migration.
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
            sql.Literal(f"{LOCK_WAIT_S * 1000}ms")))
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("SET LOCAL lock_timeout TO DEFAULT")  # the migrations' own DDL waits
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


def _lock_held(conn: psycopg.Connection) -> str:
    """One line: who holds the migrations' lock, and what to do about it."""
    row = conn.execute(
        "SELECT a.pid, a.application_name, a.state, extract(epoch FROM now() - a.xact_start) "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = "
        "'advisory' AND l.granted AND l.classid = %s AND l.objid = %s AND l.objsubid = 1",
        (_LOCK_KEY >> 32, _LOCK_KEY & 0xFFFFFFFF)).fetchone()
    holder = "another session" if row is None else (
        f"pid {row[0]} ({row[1] or 'no application name'}, {row[2]}, in a transaction for "
        f"{float(row[3] or 0):.0f} s)")
    return (f"the catalog's migrations waited {LOCK_WAIT_S} s for their lock, held by "
            f"{holder}: if that process is stuck, end it (SELECT pg_terminate_backend(pid)) "
            "and run the command again")
