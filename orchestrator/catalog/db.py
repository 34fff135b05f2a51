"""Connections to PostgreSQL, with driver errors translated in one place."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from orchestrator.errors import ServiceUnavailableError


def open_connection(dsn: str, *, autocommit: bool = False) -> psycopg.Connection:
    """A connection the caller closes (``connect`` closes it for you)."""
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10,
                               application_name="kappa")
    except psycopg.OperationalError as exc:
        # The DSN may carry a password: never echo it.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServiceUnavailableError(
            f"cannot connect to PostgreSQL ({first}): start it with `kappa dev up` "
            "or fix KAPPA_PG_DSN"
        ) from exc


@contextmanager
def connect(dsn: str, *, autocommit: bool = False) -> Iterator[psycopg.Connection]:
    conn = open_connection(dsn, autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


def qualified(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))
