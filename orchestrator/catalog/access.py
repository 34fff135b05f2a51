"""How the service's capabilities reach the catalog: a connection per call, and one connection
kept open for switches. The catalog's migrations run once per instance, before its first use."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from orchestrator.catalog.db import connect, open_connection
from orchestrator.catalog.migrations import migrate
from orchestrator.settings import Settings


class CatalogAccess:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._migrated = False
        self._kept: psycopg.Connection | None = None
        self._kept_lock = threading.Lock()
        self._close_kept: Callable[[], Any] = lambda: None

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        dsn, _ = self.settings.require_services()
        # Autocommit: every change is an explicit `conn.transaction()`.
        with connect(dsn, autocommit=True) as conn:
            self._migrate(conn)
            yield conn

    @contextmanager
    def kept(self) -> Iterator[psycopg.Connection]:
        """The connection kept for switches, opened at the first and reopened when broken: a
        switch opens no connection on its critical path. One holder at a time."""
        with self._kept_lock:
            conn = self._kept
            if conn is None or conn.closed or conn.broken:
                dsn, _ = self.settings.require_services()
                conn = self._kept = open_connection(dsn, autocommit=True)
                # Closed with this object (or at exit), never left for the GC to complain about.
                self._close_kept = weakref.finalize(self, conn.close)
                self._migrate(conn)
            yield conn

    def close(self) -> None:
        """Close the kept connection; the next `kept()` reopens it."""
        with self._kept_lock:
            self._close_kept()
            self._kept = None

    def _migrate(self, conn: psycopg.Connection) -> None:
        if not self._migrated:
            migrate(conn, self.settings.catalog_schema)
            self._migrated = True
