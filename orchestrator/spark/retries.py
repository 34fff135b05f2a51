"""How a driver outlasts what goes wrong: outages waited out however long, failed queries
restarted from the checkpoint after a growing pause, and poison batches and mistakes in the
job's code failed at once. It owns the driver's catalog connection, which an outage closes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from orchestrator.catalog import runs
from orchestrator.models import DeployedVersion
from orchestrator.settings import Settings
from orchestrator.spark.batch_commit import BatchCommit
from orchestrator.spark.failures import POISON_ATTEMPTS, is_outage, job_error, root_cause
from orchestrator.spark.shape import JobError
from orchestrator.spark.writer import connect_catalog

log = logging.getLogger("kappa.driver")
T = TypeVar("T")
BACKOFF_S = (2, 4, 8, 16, 30)  # then 30 s between retries, for as long as it takes
MAX_QUERY_FAILURES = 10
FAILURE_WINDOW_S = 600


class Retries:
    def __init__(self, settings: Settings, dsn: str, conn: psycopg.Connection,
                 version: DeployedVersion, attempt: int):
        self.settings, self.dsn, self.conn = settings, dsn, conn
        self.version, self.attempt = version, attempt

    def reconnect(self) -> None:
        if self.conn.closed or self.conn.broken:
            self.conn = connect_catalog(self.dsn)

    def wait_out_outages(self, step: Callable[[], T], doing: str) -> T:
        """Run ``step`` until no outage stops it, on a fresh connection after each. A broker
        that comes up after the drivers (a host's reboot) is waited for, however long, as it
        is once the query runs; so is a PostgreSQL that restarts between two of the driver's
        own catalog statements (its connection is then closed under it)."""
        retries = 0
        while True:
            try:
                self.reconnect()
                if retries:  # the noted reason no longer holds (before a step that sets one)
                    self.note(None)
                return step()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if isinstance(exc, psycopg.Error):
                    self.conn.close()  # the next try connects anew
                retries += 1
                delay = BACKOFF_S[min(retries, len(BACKOFF_S)) - 1]
                log.warning("cannot %s yet (unreachable service: %s); trying again in %ds "
                            "(retry %d)", doing, root_cause(exc), delay, retries)
                self.note(f"retrying after unreachable service (to {doing}): "
                          f"{root_cause(exc)}")
                time.sleep(delay)

    def run_resilient(self, run_query: Callable[[], None], sink: BatchCommit) -> None:
        """Run a query; when it fails, restart it from the checkpoint after a pause that grows
        to a cap. Exactly-once makes that safe.

        - An outage (PostgreSQL or the broker unreachable) is waited out, however long.
        - A batch that fails ``POISON_ATTEMPTS`` times for another reason fails the driver,
          with its offsets, the error and the remedy (a poison batch).
        - Other failures (outside any batch) fail it after too many in ten minutes.
        - A mistake in the job's code fails it at once: running it again cannot help."""
        failures: list[float] = []
        retries, commits = 0, sink.commits
        while True:
            try:
                run_query()
                return
            except Exception as exc:
                if sink.commits != commits:  # progress since the last failure: start over
                    retries, commits = 0, sink.commits
                if sink.stale or "StaleDriverError" in str(exc):
                    raise
                mistake = job_error(exc)
                if mistake is not None:
                    raise mistake from exc
                v = self.version
                poison = sink.failure
                if poison is not None and poison.attempts >= POISON_ATTEMPTS:
                    raise JobError(poison.reason(v.job, v.version)) from exc
                outage = is_outage(exc)
                now = time.monotonic()
                if not outage and poison is None:
                    failures = [t for t in failures if now - t < FAILURE_WINDOW_S] + [now]
                    if len(failures) > MAX_QUERY_FAILURES:
                        raise
                retries += 1
                delay = BACKOFF_S[min(retries, len(BACKOFF_S)) - 1]
                what = "unreachable service" if outage else "failure"
                log.warning("query failed (%s: %s); restarting it from the checkpoint in %ds "
                            "(retry %d)", what, root_cause(exc), delay, retries)
                sink.retry_noted = self.note(f"retrying after {what}: {root_cause(exc)}")
                time.sleep(delay)
                self.wait_out_outages(sink.reconnect, "reconnect to the catalog")

    def note(self, reason: str | None) -> bool:
        """Best effort: show why the version makes no progress (`kappa status`), if the catalog
        can be reached at all; None clears it."""
        try:
            self.reconnect()
            with self.conn.transaction():
                runs.note_reason(self.conn, self.settings.catalog_schema, self.version.id,
                                 self.attempt, reason and reason[:500], while_active=True)
        except psycopg.Error:
            self.conn.close()
            return False
        return True
