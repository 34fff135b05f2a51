"""The facade that the CLI, the Airflow DAGs and Python callers use."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from orchestrator import monitor
from orchestrator.aliases.diff import DiffReport
from orchestrator.catalog import aliases as alias_rows
from orchestrator.catalog import events, output, runs, versions
from orchestrator.catalog.batches import gap_to_new_log
from orchestrator.catalog.db import connect, open_connection
from orchestrator.catalog.migrations import migrate
from orchestrator.determinism import replay_hazards
from orchestrator.errors import (
    KappaError,
    LaunchError,
    LogChangedError,
    NotFoundError,
    ServiceUnavailableError,
    StateError,
)
from orchestrator.jobspec import load_job_file
from orchestrator.lag import (
    LagState,
    LogMismatch,
    Thresholds,
    lag_against,
    log_changed_reason,
    log_mismatches,
    replay_start,
)
from orchestrator.log_identity import log_gone_reason, read_lost_records
from orchestrator.models import (
    AliasState,
    DeployedVersion,
    Offsets,
    RunRecord,
    VersionLag,
    VersionStatus,
)
from orchestrator.monitor import fail_on_log_change
from orchestrator.naming import consumer_group, dead_letter_table, output_table, validate_name
from orchestrator.settings import Settings, load_settings
from orchestrator.spark import launcher
from orchestrator.states import RunState
from orchestrator.switching import Switchboard

Progress = Callable[[VersionStatus], None]
# Between recording an attempt and recording its driver's PID there is only a process spawn: a
# run without a PID for this long lost its deploying process.
_LAUNCH_GRACE_S = 60.0
# How the reason of a driver that died without a word begins (the agent restarts those).
CRASHED = "driver process"


@dataclass(frozen=True)
class DeployResult:
    created: bool  # False: the same code was already deployed under this label (a no-op)
    status: VersionStatus
    # Constructs that make the output at rest depend on where batches were cut (file:line: why)
    warnings: tuple[str, ...] = ()


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

    # Deploying -----------------------------------------------------------------------------
    def deploy(self, job_file: str | Path, *, allow_gap: bool = False) -> DeployResult:
        from orchestrator.kafka.admin import check_access, log_identity, topic_partitions
        from orchestrator.kafka.offsets import log_bounds

        spec = load_job_file(job_file)
        hazards = tuple(replay_hazards(spec))
        s = self.settings
        _, bootstrap = s.require_services()
        check_access(bootstrap)  # a refused certificate or password, named before anything runs
        with self._catalog() as conn:
            existing = versions.find(conn, s.catalog_schema, spec.name, spec.version)
            if existing is not None:
                versions.check_same_code(existing, spec)
                if runs.get(conn, s.catalog_schema, existing.id).state == RunState.REGISTERED:
                    # Registered by a deploy that crashed before it launched the driver.
                    self._start(conn, existing)
                return DeployResult(False, self._status_of(conn, existing), hazards)
            for topic in spec.topics:
                topic_partitions(bootstrap, topic)  # a clear error for a missing topic
            # Before the bounds: a topic recreated in between fails the version, never blesses
            # a log it did not read.
            identity = log_identity(bootstrap, list(spec.topics))
            bounds = log_bounds(bootstrap, list(spec.topics))
            log_start, gone = replay_start(bounds, allow_gap=allow_gap)
            out, dlq = output_table(spec.name, spec.version), dead_letter_table(spec.name,
                                                                                spec.version)
            checkpoint = checkpoint_location(s, spec.name, spec.version)
            with conn.transaction():
                version = versions.insert(
                    conn, s.catalog_schema, spec, output_table=out, dead_letter_table=dlq,
                    checkpoint_dir=checkpoint,
                    consumer_group=consumer_group(spec.name, spec.version), log_start=log_start,
                    log_identity=identity)
                output.create_tables(conn, s.data_schema, spec, out, dlq)
                runs.create(conn, s.catalog_schema, version.id)
                events.record(conn, s.catalog_schema, "deploy", job=spec.name,
                              version=spec.version, fingerprint=spec.fingerprint,
                              file=str(spec.path), log_start=log_start, allow_gap=allow_gap,
                              log_identity=identity.to_json(),
                              gap_offsets=gone, files=[p for p, _ in spec.files],
                              replay_hazards=list(hazards))
            self._start(conn, version)
            # So that a later switch to this version needs no DDL.
            self._switchboard(conn).refresh_views(spec.name)
            events.prune(conn, s.catalog_schema, s.events_kept)
            return DeployResult(True, self._status_of(conn, version), hazards)

    def _start(self, conn: psycopg.Connection, version: DeployedVersion) -> RunRecord:
        s = self.settings
        with conn.transaction():
            run = runs.get(conn, s.catalog_schema, version.id, for_update=True)
            attempt = run.attempt + 1
            runs.change_state(conn, s.catalog_schema, version, RunState.STARTING,
                              attempt=attempt, pid=None, pid_started=None, app_id=None,
                              heartbeat_at=None, started_at=datetime.now(UTC))
        try:
            process = launcher.launch(s, version.job, version.version, attempt)
        except OSError as exc:
            with conn.transaction():
                runs.change_state(conn, s.catalog_schema, version, RunState.FAILED,
                                  reason=f"could not launch the driver: {exc}",
                                  expect_attempt=attempt)
            raise LaunchError(f"could not launch the driver of {version.job} "
                              f"{version.version}: {exc}; fix it, then `kappa restart "
                              f"{version.job} {version.version}`") from exc
        with conn.transaction():
            conn.execute(
                psycopg.sql.SQL("UPDATE {}.runs SET pid = %s, pid_started = %s, log_path = %s, "
                                "host = %s WHERE version_id = %s AND attempt = %s")
                .format(psycopg.sql.Identifier(s.catalog_schema)),
                (process.pid, process.started, str(process.log_path), launcher.this_host(),
                 version.id, attempt))
            return runs.get(conn, s.catalog_schema, version.id)

    # Controlling ---------------------------------------------------------------------------
    def stop(self, job: str, version: str) -> VersionStatus:
        s = self.settings
        with self._catalog() as conn:
            deployed = versions.get(conn, s.catalog_schema, _job(job), _version(version))
            run = runs.get(conn, s.catalog_schema, deployed.id)
            if run.state in (RunState.STOPPED, RunState.RETIRED, RunState.REGISTERED):
                raise StateError(f"{job} {version} is already {run.state.value}: nothing to stop")
            with conn.transaction():
                runs.change_state(conn, s.catalog_schema, deployed, RunState.STOPPED,
                                  reason="stopped by `kappa stop`")
            launcher.stop_driver(run)
            return self._status_of(conn, deployed)

    def stop_all(self) -> list[VersionStatus]:
        """Stop every version whose driver should be running (before the services go away)."""
        return [self.stop(st.job, st.version) for st in self.status() if st.state.is_active]

    def restart(self, job: str, version: str, *, allow_gap: bool = False,
                quarantine: bool = False) -> VersionStatus:
        """Resume a version from its checkpoint, replacing its driver if one still runs.

        A version whose log changed under it (a topic recreated, retention past what it read)
        is refused, and recorded failed, unless ``allow_gap``: then it resumes at each such
        partition's log start, and the event log records the offsets it skipped. A stream job
        whose checkpoint (its state) is gone is refused: redeploy it under a new version.

        ``quarantine``: the next batch (the one that kept failing) is re-run range by range, and
        the records that fail go to the dead-letter table with their error (batch jobs)."""
        from orchestrator.catalog.batches import next_batch_id
        from orchestrator.spark.checkpoint import Checkpoint, is_local

        s = self.settings
        with self._catalog() as conn:
            deployed = versions.get(conn, s.catalog_schema, _job(job), _version(version))
            run = runs.get(conn, s.catalog_schema, deployed.id)
            if run.state == RunState.RETIRED:
                raise StateError(f"{job} {version} is retired: deploy a new version instead")
            with conn.transaction():
                processed = runs.processed_offsets(conn, s.catalog_schema, deployed.id)
                applied = next_batch_id(conn, s.catalog_schema, deployed.id)
            if (deployed.spec.mode == "stream" and applied
                    and is_local(deployed.checkpoint_dir)
                    and not Checkpoint(deployed.checkpoint_dir).has_batches()):
                raise StateError(
                    f"the checkpoint of {job} {version} ({deployed.checkpoint_dir}) is gone, "
                    "and with it the state of its stream job: its output cannot be continued "
                    "exactly. Deploy the job under a new VERSION, which replays from offset 0")
            if read_lost_records(run.reason):
                raise LogChangedError(str(run.reason))
            launcher.stop_driver(run)
            if run.state.is_active:
                with conn.transaction():
                    run = runs.change_state(conn, s.catalog_schema, deployed, RunState.STOPPED,
                                            reason="replaced by `kappa restart`") or run
            identity = monitor.current_identity(s, list(deployed.spec.topics))
            gone = monitor.log_gone(deployed, identity)
            if gone and not allow_gap:
                monitor.fail_on_log_gone(conn, s.catalog_schema, deployed, run, gone)
                raise LogChangedError(log_gone_reason(gone, job, version))
            bounds = self._bounds(deployed)
            mismatches = [] if bounds is None else log_mismatches(
                processed or deployed.log_start, bounds)
            if gone:
                # The whole of each changed topic (every topic on another cluster) is a new log.
                changed = {c.topic for c in gone} if all(c.topic for c in gone) \
                    else set(deployed.spec.topics)
                mismatches = [LogMismatch(t, p, (processed or deployed.log_start).get(t, {})
                                          .get(str(p), first), first, end, replaced=True)
                              for (t, p), (first, end) in sorted((bounds or {}).items())
                              if t in changed]
                if any(c.kind == "gone" for c in gone):
                    raise NotFoundError(log_gone_reason(gone, job, version))
                if bounds is None:
                    raise ServiceUnavailableError(
                        f"the log ends of {', '.join(deployed.spec.topics)} cannot be read now: "
                        "check the broker, then run the same command again")
            if mismatches and not allow_gap:
                fail_on_log_change(conn, s.catalog_schema, deployed, run, processed,
                                   bounds or {})
                raise LogChangedError(log_changed_reason(mismatches, job, version))
            if mismatches:
                self._skip_gap(conn, deployed, mismatches)
            if gone and identity is not None:
                with conn.transaction():
                    deployed = versions.set_log_identity(conn, s.catalog_schema, deployed,
                                                         identity)
            if quarantine:
                if deployed.spec.mode != "batch":
                    raise StateError(
                        f"{job} {version} is a stream job: its records pass through its state "
                        "and cannot be re-run one range at a time; fix the job and redeploy it "
                        "under a new VERSION")
                with conn.transaction():
                    runs.set_quarantine_batch(conn, s.catalog_schema, deployed.id, applied)
                    events.record(conn, s.catalog_schema, "quarantine_requested", job=job,
                                  version=version, batch=applied, previous_reason=run.reason)
            self._start(conn, deployed)
            return self._status_of(conn, deployed)

    def _skip_gap(self, conn: psycopg.Connection, v: DeployedVersion,
                  mismatches: list[LogMismatch]) -> None:
        """Move the version's position to the log start of each changed partition, and start a
        new checkpoint from the catalog there (the old one is kept aside)."""
        from orchestrator.spark.checkpoint import is_local, set_aside_local

        s = self.settings
        if v.spec.mode == "stream":
            raise StateError(
                f"{v.job} {v.version} is a stream job: its state describes the old log and "
                "cannot skip to a new one. Deploy the job under a new VERSION, which replays "
                "the log as it is now")
        if not is_local(v.checkpoint_dir):
            raise StateError(
                f"the checkpoint of {v.job} {v.version} is at {v.checkpoint_dir}: remove it "
                "(it records the old positions), then run `kappa restart --allow-gap` again")
        aside = set_aside_local(v.checkpoint_dir, f"before-gap-{int(time.time())}")
        with conn.transaction():
            for m in mismatches:
                gap_to_new_log(conn, s.catalog_schema, v.id, m.topic, m.partition,
                               m.log_start, recreated=m.recreated)
            events.record(conn, s.catalog_schema, "gap", job=v.job, version=v.version,
                          partitions=[{"topic": m.topic, "partition": m.partition,
                                       "processed": m.processed, "log_start": m.log_start,
                                       "log_end": m.log_end, "recreated": m.recreated}
                                      for m in mismatches],
                          reason=log_changed_reason(mismatches, v.job, v.version),
                          checkpoint_set_aside=aside)

    # Reporting -----------------------------------------------------------------------------
    def status(self, job: str | None = None, *, exact_rows: bool = True) -> list[VersionStatus]:
        """Every (or one job's) version. ``exact_rows=False`` (the agent, every few seconds)
        scans no table: output rows come from PostgreSQL's statistics, dead letters the batches'
        totals."""
        s = self.settings
        with self._catalog() as conn:
            if job is not None and not versions.job_exists(conn, s.catalog_schema, _job(job)):
                raise NotFoundError(f"unknown job {job!r}: `kappa status` lists deployed jobs")
            return [self._status_of(conn, v, exact_rows=exact_rows) for v in
                    versions.list_all(conn, s.catalog_schema, job)]

    def version_status(self, job: str, version: str) -> VersionStatus:
        s = self.settings
        with self._catalog() as conn:
            deployed = versions.get(conn, s.catalog_schema, _job(job), _version(version))
            return self._status_of(conn, deployed)

    def wait(self, job: str, version: str, *, timeout_s: float | None = None,
             max_lag: int = 0, progress: Progress | None = None, poll_s: float = 1.0,
             limits: Thresholds | None = None) -> VersionStatus:
        """Block until the version has caught up (at most ``max_lag`` records behind); raise on
        failure, stop, stall or timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        window = (limits or Thresholds()).window_s
        next_stall_check = 0.0
        while True:
            # Measuring lag costs broker round trips: a few per window are enough.
            check_stall = time.monotonic() >= next_stall_check
            if check_stall:
                next_stall_check = time.monotonic() + window / 6
            st = self.catch_up_progress(job, version, max_lag=max_lag, check_stall=check_stall,
                                        limits=limits)
            if progress:
                progress(st)
            if st.caught_up(max_lag):
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise KappaError(f"{job} {version} has not caught up after {timeout_s:.0f}s "
                                 f"({st.lag_records} records behind); it keeps running: "
                                 f"`kappa lag {job}`")
            time.sleep(poll_s)

    def catch_up_progress(self, job: str, version: str, *, max_lag: int = 0,
                          check_stall: bool = True, limits: Thresholds | None = None
                          ) -> VersionStatus:
        """One look at a version that is catching up: its status, or an error if it failed,
        was stopped or (with ``check_stall``) has stalled. Pollers (``wait``, the Airflow
        trigger) call this until ``status.caught_up(max_lag)``."""
        st = self.version_status(job, version)
        if st.state == RunState.RETIRED:
            raise StateError(f"{job} {version} is retired: deploy a new version instead")
        if st.log_gone:  # the reason says what to run; a restart would not help
            raise StateError(f"{job} {version} is {st.state.value}: {st.reason}")
        if st.state in (RunState.FAILED, RunState.STOPPED):
            why = f" ({st.reason})" if st.reason else ""
            log = f"; its driver's log: {st.log_path}" if st.state == RunState.FAILED else ""
            raise StateError(f"{job} {version} is {st.state.value}{why}: run `kappa restart "
                             f"{job} {version}` to resume it{log}")
        if st.caught_up(max_lag) or st.state == RunState.STARTING or not check_stall:
            return st
        window = (limits or Thresholds()).window_s
        (measured,) = self.lag(job, version, limits)
        if measured.state == LagState.STALLED:
            raise KappaError(f"{job} {version} is stalled: {measured.lag_records} records behind "
                             f"and no progress for {window:.0f}s; see the log {st.log_path}")
        return st

    def _status_of(self, conn: psycopg.Connection, v: DeployedVersion, *,
                   exact_rows: bool = True) -> VersionStatus:
        from orchestrator.catalog.batches import dead_letter_total

        s = self.settings
        with conn.transaction():
            run = self._check_liveness(conn, v, runs.get(conn, s.catalog_schema, v.id))
            processed = runs.processed_offsets(conn, s.catalog_schema, v.id)
            if exact_rows:
                rows = output.count_rows(conn, s.data_schema, v.output_table)
                dead = output.count_rows(conn, s.data_schema, v.dead_letter_table)
            else:
                rows = output.estimate_rows(conn, s.data_schema, v.output_table)
                dead = dead_letter_total(conn, s.catalog_schema, v.id)
        identity = monitor.current_identity(s, list(v.spec.topics))
        gone = monitor.log_gone(v, identity)
        bounds = None if gone else self._bounds(v)
        lag = None
        if gone:
            # No lag against a log the version never read.
            run = monitor.fail_on_log_gone(conn, s.catalog_schema, v, run, gone)
        elif bounds is not None:
            run = fail_on_log_change(conn, s.catalog_schema, v, run, processed, bounds, identity)
            lag = lag_against(processed or v.log_start, bounds)
        age = None
        if run.heartbeat_at is not None and run.state.is_active:
            age = round((datetime.now(UTC) - run.heartbeat_at).total_seconds(), 1)
        active = run.state.is_active
        return VersionStatus(
            job=v.job, version=v.version, state=run.state, pid=run.pid if active else None,
            app_id=run.app_id, output_table=f"{s.data_schema}.{v.output_table}",
            dead_letter_table=f"{s.data_schema}.{v.dead_letter_table}", rows=rows,
            dead_letters=dead, processed_offsets=processed or _zero(v.log_start),
            lag_records=lag, heartbeat_age_s=age, reason=run.reason, attempt=run.attempt,
            log_path=run.log_path, started_at=run.started_at,
            log_tail=launcher.log_tail(run.log_path) if run.state == RunState.FAILED else (),
            log_gone=bool(gone) or read_lost_records(run.reason),
        )

    def _check_liveness(self, conn: psycopg.Connection, v: DeployedVersion, run: RunRecord
                        ) -> RunRecord:
        """An active run whose driver is gone (or silent) is recorded as failed."""
        if not run.state.is_active:
            return run
        # A silent driver whose process exists (paused, in a long GC) is not failed: the lag
        # state shows it as stalled. Only a gone process is a failure.
        reason = None
        alive = launcher.driver_alive(run)
        if alive is None:  # on another host: only its heartbeats tell
            beat = run.heartbeat_at or run.started_at
            silent = (datetime.now(UTC) - beat).total_seconds() if beat else 0.0
            if silent > self.settings.heartbeat_timeout_s:
                reason = (f"the driver on {run.host} has not beaten for {silent:.0f}s (more "
                          f"than heartbeat_timeout_s={self.settings.heartbeat_timeout_s:g}): "
                          f"it is dead or cut off; `kappa restart {v.job} {v.version}`")
        elif alive is False:
            if run.pid is None:
                started = run.started_at or datetime.now(UTC)
                if (datetime.now(UTC) - started).total_seconds() < _LAUNCH_GRACE_S:
                    return run  # being launched right now
                reason = (f"the driver was never launched (the process deploying it died); "
                          f"`kappa restart {v.job} {v.version}`")
            else:
                reason = f"{CRASHED} {run.pid} is gone; last log lines in {run.log_path}"
        if reason is None:
            return run
        updated = runs.change_state(conn, self.settings.catalog_schema, v, RunState.FAILED,
                                    reason=reason, expect_attempt=run.attempt)
        return updated or run

    def _bounds(self, v: DeployedVersion) -> dict[tuple[str, int], tuple[int, int]] | None:
        from orchestrator.kafka.offsets import log_bounds

        _, bootstrap = self.settings.require_services()
        try:
            return log_bounds(bootstrap, list(v.spec.topics))
        except KappaError:
            return None

    def lag(self, job: str | None = None, version: str | None = None,
            limits: Thresholds | None = None) -> list[VersionLag]:
        """Measure every (or one) version's lag now, and judge its state from the history."""
        s = self.settings
        limits = replace(limits or Thresholds(), max_lag_records=s.max_lag_records)
        with self._catalog() as conn:
            if job is not None and not versions.job_exists(conn, s.catalog_schema, _job(job)):
                raise NotFoundError(f"unknown job {job!r}: `kappa status` lists deployed jobs")
            chosen = [v for v in versions.list_all(conn, s.catalog_schema, job)
                      if version is None or v.version == _version(version)]
            if version is not None and not chosen:
                versions.get(conn, s.catalog_schema, _job(job or ""), version)
            result = []
            for v in chosen:
                with conn.transaction():
                    run = self._check_liveness(conn, v, runs.get(conn, s.catalog_schema, v.id))
                if run.state != RunState.RETIRED:
                    # Throw-away broker clients: a consumer kept across samples crashed the
                    # process (librdkafka) when a topic it had read was deleted and recreated.
                    result.append(monitor.measure(conn, s, v, run, limits))
            return result

    # Aliases -------------------------------------------------------------------------------
    def _switchboard(self, conn: psycopg.Connection) -> Switchboard:
        s = self.settings

        def measure_now(deployed: DeployedVersion) -> int | None:
            processed = runs.processed_offsets(conn, s.catalog_schema, deployed.id)
            bounds = self._bounds(deployed)
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
                    run = self._check_liveness(conn, v, runs.get(conn, s.catalog_schema, v.id))
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

    def archive_restore(self, topics: Sequence[str] = ()) -> Any:
        """Write archived topics that the broker does not hold back into it, offset for
        offset, checked against the manifest; report what a crash lost before the archive."""
        from orchestrator.archive.restore import Restorer

        with self._catalog() as conn:
            return Restorer(self.settings, conn, self.settings.require_services()[1]).restore(
                topics)

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


def checkpoint_location(settings: Settings, job: str, version: str) -> str:
    from orchestrator.spark.checkpoint import is_local, local_path

    root = settings.checkpoint_root or str(settings.state_dir / "checkpoints")
    if is_local(root):
        return str((local_path(root) / job / version).resolve())
    return f"{root.rstrip('/')}/{job}/{version}"


def _job(name: str) -> str:
    return validate_name(name, "job name")


def _version(name: str) -> str:
    return validate_name(name, "version")


def _zero(log_start: Offsets) -> Offsets:
    return {t: dict(ps) for t, ps in log_start.items()}

