"""What the facade reports about versions: status, waiting, catch-up progress and lag."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg

from orchestrator.catalog import events, output, runs, versions
from orchestrator.catalog.access import CatalogAccess
from orchestrator.errors import (
    KappaError,
    NotFoundError,
    StateError,
)
from orchestrator.failpoints import fail_point
from orchestrator.lag import (
    LagState,
    Thresholds,
    lag_against,
)
from orchestrator.log_identity import read_lost_records
from orchestrator.models import (
    DeployedVersion,
    Offsets,
    RunRecord,
    VersionLag,
    VersionStatus,
)
from orchestrator.naming import validate_name
from orchestrator.observe import monitor
from orchestrator.observe.monitor import fail_on_log_change
from orchestrator.replay_queue import queries as queue
from orchestrator.replay_queue import slots
from orchestrator.spark.launch import launcher
from orchestrator.states import RunState

Progress = Callable[[VersionStatus], None]
# Between recording an attempt and recording its driver's PID there is only a process spawn: a
# run without a PID for this long lost its deploying process.
_LAUNCH_GRACE_S = 60.0
# How the reason of a driver that died without a word begins (the agent restarts those).
CRASHED = "driver process"


def status(catalog: CatalogAccess, job: str | None = None, *, exact_rows: bool = True
           ) -> list[VersionStatus]:
    """Every (or one job's) version. ``exact_rows=False`` (the agent, every few seconds)
    scans no table: output rows come from PostgreSQL's statistics, dead letters the batches'
    totals."""
    s = catalog.settings
    with catalog.connection() as conn:
        if job is not None and not versions.job_exists(conn, s.catalog_schema, _job(job)):
            raise NotFoundError(f"unknown job {job!r}: `kappa status` lists deployed jobs")
        return [status_of(catalog, conn, v, exact_rows=exact_rows) for v in
                versions.list_all(conn, s.catalog_schema, job)]


def version_status(catalog: CatalogAccess, job: str, version: str) -> VersionStatus:
    s = catalog.settings
    with catalog.connection() as conn:
        deployed = versions.get(conn, s.catalog_schema, _job(job), _version(version))
        return status_of(catalog, conn, deployed)


def wait(catalog: CatalogAccess, job: str, version: str, *, timeout_s: float | None = None,
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
        st = catch_up_progress(catalog, job, version, max_lag=max_lag, check_stall=check_stall,
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


def catch_up_progress(catalog: CatalogAccess, job: str, version: str, *, max_lag: int = 0,
                      check_stall: bool = True, limits: Thresholds | None = None
                      ) -> VersionStatus:
    """One look at a version that is catching up: its status, or an error if it failed,
    was stopped or (with ``check_stall``) has stalled. Pollers (``wait``, the Airflow
    trigger) call this until ``status.caught_up(max_lag)``."""
    st = version_status(catalog, job, version)
    if st.state == RunState.QUEUED:
        fail_dead_slot_holders(catalog)
        where = slots.waiting(catalog, job, version)
        if where is not None:
            return replace(st, reason=where)
        st = version_status(catalog, job, version)
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
    (measured,) = lag(catalog, job, version, limits)
    if measured.state == LagState.STALLED:
        raise KappaError(f"{job} {version} is stalled: {measured.lag_records} records behind "
                         f"and no progress for {window:.0f}s; see the log {st.log_path}")
    return st


def status_of(catalog: CatalogAccess, conn: psycopg.Connection, v: DeployedVersion, *,
               exact_rows: bool = True) -> VersionStatus:
    from orchestrator.archive.decode_pass import version_progress
    from orchestrator.catalog.batches import dead_letter_total

    s = catalog.settings
    with conn.transaction():
        run = check_liveness(catalog, conn, v, runs.get(conn, s.catalog_schema, v.id))
        processed = runs.processed_offsets(conn, s.catalog_schema, v.id)
        decoded = version_progress(conn, s.catalog_schema, v) if s.decoded_segments else None
        if exact_rows:
            rows = output.count_rows(conn, s.data_schema, v.output_table)
            dead = output.count_rows(conn, s.data_schema, v.dead_letter_table)
        else:
            rows = output.estimate_rows(conn, s.data_schema, v.output_table)
            dead = dead_letter_total(conn, s.catalog_schema, v.id)
    identity = monitor.current_identity(s, list(v.spec.topics))
    gone = monitor.log_gone(v, identity)
    bounds = None if gone else monitor.bounds_of(s, v, conn)
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
        log_gone=bool(gone) or read_lost_records(run.reason), decoded=decoded,
    )


def fail_dead_slot_holders(catalog: CatalogAccess) -> None:
    """Record as failed each catch-up holding a replay slot whose driver is gone, so that the
    queue's next look hands its slot on: with no agent sampling the versions, nobody else
    would notice (a waiting deploy waited out its timeout)."""
    schema = catalog.settings.catalog_schema
    with catalog.connection() as conn:
        for version_id in queue.holders(conn, schema):
            with conn.transaction():
                check_liveness(catalog, conn, versions.by_id(conn, schema, version_id),
                               runs.get(conn, schema, version_id))


def check_liveness(catalog: CatalogAccess, conn: psycopg.Connection, v: DeployedVersion,
                   run: RunRecord) -> RunRecord:
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
        if silent > catalog.settings.heartbeat_timeout_s:
            reason = (f"the driver on {run.host} has not beaten for {silent:.0f}s (more "
                      f"than heartbeat_timeout_s={catalog.settings.heartbeat_timeout_s:g}): "
                      f"it is dead or cut off; `kappa restart {v.job} {v.version}`")
    elif alive is False:
        if run.pid is None and run.queued_at is not None:  # started by the replay queue
            schema = catalog.settings.catalog_schema
            return slots.requeue_if_abandoned(conn, schema, v) or run
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
    fail_point("status.before_failing_a_dead_driver")
    # Only from the state it was judged in: a stop or a pause since has stopped the driver too.
    updated = runs.change_state(conn, catalog.settings.catalog_schema, v, RunState.FAILED,
                                reason=reason, expected=run.as_seen())
    return updated or runs.get(conn, catalog.settings.catalog_schema, v.id)


def lag(catalog: CatalogAccess, job: str | None = None, version: str | None = None,
        limits: Thresholds | None = None) -> list[VersionLag]:
    """Measure every (or one) version's lag now, and judge its state from the history."""
    s = catalog.settings
    limits = replace(limits or Thresholds(), max_lag_records=s.max_lag_records)
    with catalog.connection() as conn:
        if job is not None and not versions.job_exists(conn, s.catalog_schema, _job(job)):
            raise NotFoundError(f"unknown job {job!r}: `kappa status` lists deployed jobs")
        chosen = [v for v in versions.list_all(conn, s.catalog_schema, job)
                  if version is None or v.version == _version(version)]
        if version is not None and not chosen:
            versions.get(conn, s.catalog_schema, _job(job or ""), version)
        result = []
        for v in chosen:
            with conn.transaction():
                run = check_liveness(catalog, conn, v, runs.get(conn, s.catalog_schema, v.id))
            if run.state != RunState.RETIRED:
                # Throw-away broker clients: a consumer kept across samples crashed the
                # process (librdkafka) when a topic it had read was deleted and recreated.
                result.append(monitor.measure(conn, s, v, run, limits))
        return result


def crashed_drivers(catalog: CatalogAccess) -> list[tuple[str, str, int, str]]:
    """(job, version, attempt, reason) of every version whose driver ran on this host and
    died without saying why (killed, out of memory): it should be running and is not."""
    s = catalog.settings
    here = launcher.this_host()
    found = []
    with catalog.connection() as conn:
        for v in versions.list_all(conn, s.catalog_schema, None):
            with conn.transaction():
                run = check_liveness(catalog, conn, v, runs.get(conn, s.catalog_schema, v.id))
            if (run.state == RunState.FAILED and run.host in (None, here)
                    and (run.reason or "").startswith(CRASHED)):
                found.append((v.job, v.version, run.attempt, run.reason or ""))
    return found


def record_event(catalog: CatalogAccess, kind: str, job: str, version: str, **detail: Any) -> None:
    with catalog.connection() as conn, conn.transaction():
        events.record(conn, catalog.settings.catalog_schema, kind, job=job, version=version,
                      **detail)


def list_events(catalog: CatalogAccess, job: str | None, version: str | None, limit: int
                ) -> list[dict[str, object]]:
    """The newest ``limit`` events, newest first."""
    with catalog.connection() as conn:
        return events.list_events(conn, catalog.settings.catalog_schema, job, version, limit)


def _job(name: str) -> str:
    return validate_name(name, "job name")


def _version(name: str) -> str:
    return validate_name(name, "version")


def _zero(log_start: Offsets) -> Offsets:
    return {t: dict(ps) for t, ps in log_start.items()}
