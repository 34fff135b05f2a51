"""The driver's heartbeat: a thread that beats into the catalog, and ends the process once a
restart has replaced its attempt or its run was stopped."""

from __future__ import annotations

import logging
import os
import threading
from datetime import datetime

import psycopg

from orchestrator.catalog import runs
from orchestrator.settings import Settings
from orchestrator.spark.writer import connect_catalog

log = logging.getLogger("kappa.driver")


class Heartbeat(threading.Thread):
    """Beats into the catalog; ends the process if a restart has replaced this attempt or its
    run was stopped."""

    def __init__(self, settings: Settings, dsn: str, version_id: int, attempt: int):
        super().__init__(name="kappa-heartbeat", daemon=True)
        self.settings, self.dsn = settings, dsn
        self.version_id, self.attempt = version_id, attempt
        self.stopping = threading.Event()
        self.busy_since: datetime | None = None  # set by the sink while a batch runs

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self.stopping.wait(self.settings.heartbeat_interval_s):
            try:
                if conn is None or conn.closed:
                    conn = connect_catalog(self.dsn)
                alive = runs.heartbeat(conn, self.settings.catalog_schema, self.version_id,
                                       self.attempt, self.busy_since)
            except psycopg.Error as exc:
                log.warning("heartbeat failed (%s); retrying", str(exc).splitlines()[0])
                conn = None
                continue
            if not alive:
                log.error("attempt %d was replaced by a restart or stopped; exiting",
                          self.attempt)
                os._exit(3)
