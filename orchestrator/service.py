"""The facade that the CLI, the Airflow DAGs and Python callers use."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from orchestrator import lifecycle, monitor, reporting
from orchestrator.aliases.diff import DiffReport
from orchestrator.catalog import aliases as alias_rows
from orchestrator.catalog import events, runs, versions
from orchestrator.catalog.db import connect, open_connection
from orchestrator.catalog.migrations import migrate
from orchestrator.errors import (
    KappaError,
)
from orchestrator.lag import (
    Thresholds,
    lag_against,
    log_mismatches,
)
from orchestrator.lifecycle import DeployResult, checkpoint_location
from orchestrator.models import (
    AliasState,
    DeployedVersion,
    VersionLag,
    VersionStatus,
)
from orchestrator.naming import validate_name
from orchestrator.reporting import CRASHED, Progress
from orchestrator.settings import Settings, load_settings
from orchestrator.spark import launcher
from orchestrator.states import RunState
from orchestrator.switching import Switchboard

__all__ = ["CRASHED", "DeployResult", "Orchestrator", "Progress", "checkpoint_location"]





class Orchestrator:
    def __init__(self, settings: Settings | None = None):
        self.settings = settings or load_settings()
        self._migrated = False
        self._switch_conn: psycopg.Connection | None = None
        self._switch_lock = threading.Lock()
        self._close_switch_conn: Callable[[], Any] = lambda: None

    @contextmanager
    def _catalog(self) -> Iterator[psycopg.Connection]:
        dsn, _ = self.settings.require_services()
        # Autocommit: every change below is an explicit `conn.transaction()`.
        with connect(dsn, autocommit=True) as conn:
            if not self._migrated:
                migrate(conn, self.settings.catalog_schema)
                self._migrated = True
            yield conn

    # Deploying and controlling ---------------------------------------------------------------
    def deploy(self, job_file: str | Path, *, allow_gap: bool = False) -> DeployResult:
        return lifecycle.deploy(self, job_file, allow_gap=allow_gap)

    def stop(self, job: str, version: str) -> VersionStatus:
        return lifecycle.stop(self, job, version)

    def stop_all(self) -> list[VersionStatus]:
        return lifecycle.stop_all(self)

    def restart(self, job: str, version: str, *, allow_gap: bool = False,
                quarantine: bool = False) -> VersionStatus:
        return lifecycle.restart(self, job, version, allow_gap=allow_gap, quarantine=quarantine)

    # Reporting -----------------------------------------------------------------------------
    def status(self, job: str | None = None, *, exact_rows: bool = True) -> list[VersionStatus]:
        return reporting.status(self, job, exact_rows=exact_rows)

    def version_status(self, job: str, version: str) -> VersionStatus:
        return reporting.version_status(self, job, version)

    def wait(self, job: str, version: str, *, timeout_s: float | None = None,
             max_lag: int = 0, progress: Progress | None = None, poll_s: float = 1.0,
             limits: Thresholds | None = None) -> VersionStatus:
        return reporting.wait(self, job, version, timeout_s=timeout_s, max_lag=max_lag,
                              progress=progress, poll_s=poll_s, limits=limits)

    def catch_up_progress(self, job: str, version: str, *, max_lag: int = 0,
                          check_stall: bool = True, limits: Thresholds | None = None
                          ) -> VersionStatus:
        return reporting.catch_up_progress(self, job, version, max_lag=max_lag,
                                           check_stall=check_stall, limits=limits)

    def lag(self, job: str | None = None, version: str | None = None,
            limits: Thresholds | None = None) -> list[VersionLag]:
        return reporting.lag(self, job, version, limits)

    # Aliases -------------------------------------------------------------------------------
    def _switchboard(self, conn: psycopg.Connection) -> Switchboard:
        s = self.settings

        def measure_now(deployed: DeployedVersion) -> int | None:
            processed = runs.processed_offsets(conn, s.catalog_schema, deployed.id)
            bounds = reporting.bounds_of(self, deployed)
            if bounds is None or log_mismatches(processed or deployed.log_start, bounds):
                return None  # no lag against a log the version did not read
            # After the bounds: a broker that cannot answer them costs no second timeout.
            if monitor.log_gone(deployed, monitor.current_identity(
                    s, list(deployed.spec.topics))):
                return None
            return lag_against(processed or deployed.log_start, bounds)

        return Switchboard(s, conn, measure_now)

    @contextmanager
    def _switching(self) -> Iterator[Switchboard]:
        """A switchboard on this service's own catalog connection, opened once and kept: a
        switch opens no connection on its critical path. One switch at a time per service."""
        with self._switch_lock:
            conn = self._switch_conn
            if conn is None or conn.closed or conn.broken:
                dsn, _ = self.settings.require_services()
                conn = self._switch_conn = open_connection(dsn, autocommit=True)
                # Closed with the service (or at exit), never left for the GC to complain about.
                self._close_switch_conn = weakref.finalize(self, conn.close)
                if not self._migrated:
                    migrate(conn, self.settings.catalog_schema)
                    self._migrated = True
            yield self._switchboard(conn)

    def close(self) -> None:
        """Close the connection kept for switches (the service stays usable: it reopens it)."""
        with self._switch_lock:
            self._close_switch_conn()
            self._switch_conn = None

    def promote(self, job: str, version: str, alias: str | None = None, *, force: bool = False,
                reason: str | None = None) -> dict[str, Any]:
        with self._switching() as board:
            return board.promote(job, version, alias, force=force, reason=reason)

    def ab(self, job: str, version: str, percent: int, alias: str | None = None, *,
           reason: str | None = None) -> dict[str, Any]:
        with self._switching() as board:
            return board.ab(job, version, percent, alias, reason=reason)

    def rollback(self, job: str, alias: str | None = None, *, reason: str | None = None,
                 force: bool = False) -> dict[str, Any]:
        """Back to what the alias served before; refused when that version is stopped or
        failed, unless ``force`` (with a ``reason``, recorded)."""
        from orchestrator.plan.cutover import abandon

        with self._switching() as board:
            switched = board.rollback(job, alias, reason=reason, force=force)
            # A cutover still ramping this alias must not carry on over the rollback.
            abandon(board.conn, self.settings.catalog_schema,
                    validate_name(alias or job, "alias"), reason or "rolled back")
            return switched

    def aliases(self) -> list[AliasState]:
        with self._catalog() as conn:
            return [AliasState(*row) for row in alias_rows.overview(
                conn, self.settings.catalog_schema)]

    def history(self, job: str, alias: str | None = None) -> list[dict[str, Any]]:
        with self._catalog() as conn:
            return self._switchboard(conn).history(job, alias)

    def diff(self, job: str, version_a: str, version_b: str) -> DiffReport:
        with self._catalog() as conn:
            return self._switchboard(conn).diff(job, version_a, version_b)

    def retire(self, job: str, version: str, *, drop: bool = False) -> dict[str, Any]:
        with self._catalog() as conn:
            return self._switchboard(conn).retire(job, version, drop=drop)

    def cutover(self, job: str, version: str, *, ramp: list[int], soak_seconds: float,
                alias: str | None = None, say: Callable[[str], None] | None = None
                ) -> dict[str, Any]:
        """Validate, ramp with soaks and guardrails, promote; resumes a crashed run; any
        failure rolls back and raises with the reason."""
        from orchestrator.plan.cutover import Cutover

        return Cutover(self, job, version, alias, say or (lambda _: None)).run(ramp,
                                                                             soak_seconds)

    def abort_cutover(self, job: str, version: str, *, reason: str, alias: str | None = None
                      ) -> int | None:
        """Roll back a cutover of ``version`` that stopped half-way; None if none is running."""
        from orchestrator.plan.cutover import Cutover

        return Cutover(self, job, version, alias, lambda _: None).abort(reason)

    def cutover_in_progress(self, job: str, alias: str | None = None) -> dict[str, Any] | None:
        """The alias's unfinished cutover plan ({"plan", "version", "next_step"}), if any."""
        from orchestrator.plan.cutover import running_plan

        with self._catalog() as conn:
            return running_plan(conn, self.settings.catalog_schema,
                                validate_name(alias or job, "alias"))

    def serving(self, job: str, alias: str | None = None) -> AliasState | None:
        """What the alias (by default named after the job) serves, or None if it does not
        exist yet."""
        name = validate_name(alias or job, "alias")
        return next((a for a in self.aliases() if a.alias == name), None)

    def crashed_drivers(self) -> list[tuple[str, str, int, str]]:
        """(job, version, attempt, reason) of every version whose driver ran on this host and
        died without saying why (killed, out of memory): it should be running and is not."""
        s = self.settings
        here = launcher.this_host()
        found = []
        with self._catalog() as conn:
            for v in versions.list_all(conn, s.catalog_schema, None):
                with conn.transaction():
                    run = reporting.check_liveness(self, conn, v,
                                                   runs.get(conn, s.catalog_schema, v.id))
                if (run.state == RunState.FAILED and run.host in (None, here)
                        and (run.reason or "").startswith(CRASHED)):
                    found.append((v.job, v.version, run.attempt, run.reason or ""))
        return found

    def record_event(self, kind: str, job: str, version: str, **detail: Any) -> None:
        with self._catalog() as conn, conn.transaction():
            events.record(conn, self.settings.catalog_schema, kind, job=job, version=version,
                          **detail)

    def events(self, job: str | None = None, version: str | None = None, *, limit: int = 1000
               ) -> list[dict[str, object]]:
        """The newest ``limit`` events, newest first."""
        with self._catalog() as conn:
            return events.list_events(conn, self.settings.catalog_schema, job, version, limit)

    # The archive of the log ----------------------------------------------------------------
    def archive(self, topics: Sequence[str] = (), *, once: bool = False,
                interval_s: float = 5.0, on_segment: Callable[[Any], None] = lambda _: None,
                stop: Callable[[], bool] = lambda: False, all_topics: bool = False) -> int:
        """Copy the topics (default: those deployed jobs read; ``all_topics``: every topic)
        into the archive's segments, once or every ``interval_s`` until ``stop()``; returns
        the segments written."""
        from orchestrator.archive.archiver import run_archiver

        dsn, bootstrap = self.settings.require_services()
        with self._catalog():  # applies the catalog's migrations (the manifest) first
            pass
        return run_archiver(self.settings, lambda: open_connection(dsn, autocommit=True),
                            bootstrap, topics, once=once, interval_s=interval_s,
                            on_segment=on_segment, stop=stop, all_topics=all_topics)

    def archive_verify(self, topics: Sequence[str] = ()) -> Any:
        """Read every segment back against its checksum, and against the log where the broker
        still holds it; an ArchiveError names the first segment that differs."""
        from orchestrator.archive.archiver import Archiver, verify

        with self._catalog() as conn:
            return verify(Archiver(self.settings, conn, self.settings.require_services()[1]),
                          topics)

    def archive_status(self, topics: Sequence[str] = ()) -> list[Any]:
        """Per partition and lineage: the archived range, the log's range, records behind."""
        from orchestrator.archive.archiver import Archiver

        with self._catalog() as conn:
            return Archiver(self.settings, conn, self.settings.require_services()[1]).status(
                topics)

    def archive_restore(self, topics: Sequence[str] = (),
                        acknowledged: Mapping[str, Mapping[int, int]] | None = None) -> Any:
        """Write archived topics that the broker does not hold back into it, offset for
        offset, checked against the manifest; report what a crash lost before the archive
        (``acknowledged``: the lost broker's acknowledged ends, from the stack's ack ledger)."""
        from orchestrator.archive.restore import Restorer

        with self._catalog() as conn:
            report = Restorer(self.settings, conn, self.settings.require_services()[1]
                              ).restore(topics, acknowledged or {})
        # A driver that read the lost topic would fail on its new id: it starts again on it.
        for job, version in report.continuing:
            self.restart(job, version)
        return report

    # Sample data ---------------------------------------------------------------------------
    def produce_sample(self, topic: str, count: int, seed: int, rate: float | None = None,
                       partitions: int = 4, *, kind: str | None = None, users: int | None = None,
                       invalid_share: float | None = None, transactional: bool = False) -> int:
        """Produce ``count`` deterministic sample records for ``seed`` to ``topic``; return how
        many reached the log.

        ``transactional``: in transactions of 1,000 records, every 5th aborted (its records
        reach the log and take offsets, but read_committed readers skip them).

        ``kind``: "pageviews" (orchestrator.sample) or "profiles" (a changelog with tombstones,
        orchestrator.sample_profiles); None picks "profiles" for a topic whose name starts with
        "profiles", else "pageviews". ``users``/``invalid_share``: None keeps the generator's
        default. Arguments are checked before the topic is created.
        """
        from orchestrator.kafka.admin import ensure_topic
        from orchestrator.kafka.producer import produce, produce_in_transactions

        if kind is None:
            kind = "profiles" if topic.startswith("profiles") else "pageviews"
        records: Iterator[tuple[bytes, bytes | None]]
        if kind == "pageviews":
            from orchestrator.sample import USERS, sample_events

            records = sample_events(count, seed, users=USERS if users is None else users,
                                    invalid_share=invalid_share)
        elif kind == "profiles":
            from orchestrator import sample_profiles as profiles

            records = profiles.sample_profiles(
                count, seed, users=profiles.USERS if users is None else users,
                invalid_share=profiles.INVALID_SHARE if invalid_share is None else invalid_share)
        else:
            raise KappaError(f"unknown sample kind {kind!r}: use pageviews or profiles")
        _, bootstrap = self.settings.require_services()
        ensure_topic(bootstrap, topic, partitions)
        if transactional:
            if rate is not None:
                raise KappaError("--transactional produces as fast as it can: drop --rate")
            result = produce_in_transactions(bootstrap, topic, records)
            return result.committed + result.aborted
        return produce(bootstrap, topic, records, rate=rate)





