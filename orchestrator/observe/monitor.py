"""Measures a version's lag against the log and judges its lag state from the history."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from orchestrator.archive.readable import log_bounds_with_archive
from orchestrator.catalog import events, lag_history, runs, versions
from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError
from orchestrator.lag import (
    LagSample,
    LagState,
    Thresholds,
    eta_seconds,
    evaluate,
    log_changed_reason,
    log_mismatches,
    rates,
    window,
)
from orchestrator.log_identity import LogChange, LogIdentity, changes, log_gone_reason
from orchestrator.models import DeployedVersion, Offsets, PartitionLag, RunRecord, VersionLag
from orchestrator.settings import Settings
from orchestrator.spark.launch import launcher
from orchestrator.states import RunState

if TYPE_CHECKING:
    from orchestrator.kafka.clients import LogClients


def current_identity(settings: Settings, topics: list[str]) -> LogIdentity | None:
    """The log's identity now, or None when the broker cannot tell (unreachable): only an
    answer is evidence that a log is gone."""
    from orchestrator.kafka.admin import log_identity

    _, bootstrap = settings.require_services()
    try:
        identity = log_identity(bootstrap, topics, timeout_s=IDENTITY_TIMEOUT_S)
        if identity.missing:
            # A broker that has just started may not know a topic for a moment: a topic is
            # gone only if it is still missing a little later.
            time.sleep(MISSING_RECHECK_S)
            identity = log_identity(bootstrap, topics, timeout_s=IDENTITY_TIMEOUT_S)
    except KappaError:
        return None
    return identity


def bounds_of(settings: Settings, version: DeployedVersion, conn: psycopg.Connection
              ) -> dict[tuple[str, int], tuple[int, int]] | None:
    """The (start, end) of every partition the version reads, or None when the broker cannot
    tell now. A start reaches below the broker's where the archive holds what retention took."""
    from orchestrator.kafka.offsets import log_bounds

    _, bootstrap = settings.require_services()
    try:
        broker = log_bounds(bootstrap, list(version.spec.topics))
    except KappaError:
        return None
    return log_bounds_with_archive(conn, settings, version.log_identity,
                                   list(version.spec.topics), broker)


IDENTITY_TIMEOUT_S = 5.0
MISSING_RECHECK_S = 1.0


def log_gone(version: DeployedVersion, identity: LogIdentity | None) -> list[LogChange]:
    """How the log now differs from the one the version read (empty: the same log, or no way
    to tell)."""
    if identity is None or version.log_identity is None:
        return []
    return changes(version.log_identity, identity, list(version.spec.topics))


def fail_on_log_gone(conn: psycopg.Connection, schema: str, version: DeployedVersion,
                     run: RunRecord, gone: list[LogChange]) -> RunRecord:
    """The version becomes failed with the reason (a failed one gets the reason: a restart
    would not help it). Its driver sees the state at its next heartbeat and exits."""
    reason = log_gone_reason(gone, version.job, version.version)
    if run.state in (RunState.REGISTERED, RunState.RETIRED) or run.reason == reason:
        return run
    with conn.transaction():
        if run.state == RunState.FAILED:
            runs.note_reason(conn, schema, version.id, run.attempt, reason)
            events.record(conn, schema, "log_gone", job=version.job, version=version.version,
                          reason=reason)
            return runs.get(conn, schema, version.id)
        updated = runs.change_state(conn, schema, version, RunState.FAILED, reason=reason,
                                    expected=run.as_seen())
    # Moved since it was read (its driver failed, a stop): the next look judges it as it is.
    return updated or runs.get(conn, schema, version.id)


def fail_on_log_change(conn: psycopg.Connection, schema: str, version: DeployedVersion,
                       run: RunRecord, processed: Offsets,
                       bounds: dict[tuple[str, int], tuple[int, int]],
                       identity: LogIdentity | None = None) -> RunRecord:
    """A version whose log is gone (another cluster, a topic recreated: ``identity`` tells),
    or whose position is no longer in the log (retention ran past what it read), becomes
    failed, with a reason that says what to run. A version deployed before log identities were
    recorded adopts the current one while its position fits the log."""
    gone = log_gone(version, identity)
    if gone:
        return fail_on_log_gone(conn, schema, version, run, gone)
    if run.state in (RunState.REGISTERED, RunState.FAILED, RunState.RETIRED):
        return run
    mismatches = log_mismatches(processed or version.log_start, bounds)
    if not mismatches:
        if version.log_identity is None and identity is not None:
            with conn.transaction():
                versions.set_log_identity(conn, schema, version, identity)
        return run
    with conn.transaction():
        updated = runs.change_state(conn, schema, version, RunState.FAILED,
                                    reason=log_changed_reason(mismatches, version.job,
                                                              version.version),
                                    expected=run.as_seen())
    return updated or runs.get(conn, schema, version.id)


def measure(conn: psycopg.Connection, settings: Settings, version: DeployedVersion,
            run: RunRecord, limits: Thresholds, clients: LogClients | None = None) -> VersionLag:
    """``clients``: broker clients kept across samples (else throw-away ones, ~0.1 s more)."""
    from orchestrator.kafka.offsets import log_bounds
    from orchestrator.kafka.timestamps import record_timestamps

    schema = settings.catalog_schema
    _, bootstrap = settings.require_services()
    with conn.transaction():
        processed = runs.processed_offsets(conn, schema, version.id)
    topics = list(version.spec.topics)
    identity = current_identity(settings, topics)
    gone = log_gone(version, identity)
    if gone:
        # No figures against a log the version never read.
        run = fail_on_log_gone(conn, schema, version, run, gone)
        with conn.transaction():
            lag_history.record_state(conn, schema, version, LagState.LOG_GONE, lag_records=None,
                                     lag_seconds=None)
        return VersionLag(job=version.job, version=version.version,
                          state=LagState.LOG_GONE.value, run_state=run.state, lag_records=None,
                          lag_seconds=None, processing_rate=0.0, produce_rate=0.0,
                          eta_seconds=None, partitions=())
    broker = clients.bounds(topics) if clients else log_bounds(bootstrap, topics)
    bounds = log_bounds_with_archive(conn, settings, version.log_identity, topics, broker)
    run = fail_on_log_change(conn, schema, version, run, processed, bounds, identity)
    now = time.time()
    position = {
        key: max(start, processed.get(key[0], {}).get(str(key[1]),
                                                       version.log_start.get(key[0], {})
                                                       .get(str(key[1]), start)))
        for key, (start, _) in bounds.items()
    }
    behind = {key: position[key] for key, (_, end) in bounds.items() if position[key] < end}
    # Below the broker's start only the archive holds the record: its age is unknown, never
    # read off the broker's first record, which is younger.
    asked = {key: at for key, at in behind.items() if at >= broker[key][0]}
    stamps = clients.timestamps(asked) if clients else record_timestamps(bootstrap, asked)
    partitions = tuple(
        PartitionLag(topic=t, partition=p, log_start=start, log_end=end,
                     processed=position[(t, p)], lag_records=max(0, end - position[(t, p)]),
                     lag_seconds=_age(now, stamps.get((t, p)), behind=(t, p) in behind))
        for (t, p), (start, end) in sorted(bounds.items())
    )
    alive = run.state.is_active and _driver_alive(run, now, settings.heartbeat_interval_s)
    sample = LagSample(at=now, processed=sum(p.processed for p in partitions),
                       log_end=sum(p.log_end for p in partitions),
                       lag_seconds=_oldest(p.lag_seconds for p in partitions),
                       driver_alive=alive)
    with conn.transaction():
        lag_history.add_sample(conn, schema, version.id, sample)
        history = lag_history.recent_samples(conn, schema, version.id, limits.window_s)
        if run.started_at is not None and run.state.is_active:
            # Judge the current attempt only: a restart after a stop is not a stall.
            history = [h for h in history if h.at >= run.started_at.timestamp()]
        # A driver still starting Spark, or still on its first batch, has nothing to show yet:
        # that is not a stall (unless it takes far longer than a start ever should).
        state = evaluate(history, limits)
        retrying = _retrying(run)
        if state == LagState.STALLED and not retrying and (
                _starting(conn, schema, version, run, now)
                or _busy(run, now, settings.heartbeat_interval_s)):
            state = LagState.CATCHING_UP
        processing, produce = rates(window(history, limits.window_s))
        if state == LagState.STOPPED:
            processing = 0.0  # no driver, no progress: the ETA says not converging
        lag_history.record_state(conn, schema, version, state, lag_records=sample.lag_records,
                                 lag_seconds=sample.lag_seconds)
    return VersionLag(
        job=version.job, version=version.version, state=state.value, run_state=run.state,
        lag_records=sample.lag_records, lag_seconds=sample.lag_seconds,
        processing_rate=round(processing, 1), produce_rate=round(produce, 1),
        eta_seconds=_rounded(eta_seconds(sample.lag_records, processing, produce)),
        partitions=partitions, reason=retrying if state == LagState.STALLED else None,
    )


STARTUP_GRACE_S = 300.0
# A batch may take this long (a quarantine, a large stateful batch) before a driver that still
# beats is judged stalled anyway.
BUSY_LIMIT_S = 1800.0


def _busy(run: RunRecord, now: float, heartbeat_interval_s: float) -> bool:
    """The driver beats and says it is working on a batch that began not too long ago."""
    if run.busy_since is None or run.heartbeat_at is None:
        return False
    fresh = now - run.heartbeat_at.timestamp() < max(3 * heartbeat_interval_s, 10.0)
    return fresh and now - run.busy_since.timestamp() < BUSY_LIMIT_S


def _starting(conn: psycopg.Connection, schema: str, version: DeployedVersion, run: RunRecord,
              now: float) -> bool:
    if run.state == RunState.STARTING:
        return True
    if run.started_at is not None and now - run.started_at.timestamp() > STARTUP_GRACE_S:
        return False
    applied = conn.execute(
        sql.SQL("SELECT 1 FROM {} WHERE version_id = %s AND attempt = %s LIMIT 1").format(
            qualified(schema, "batches")), (version.id, run.attempt)).fetchone()
    return applied is None


def _age(now: float, timestamp_ms: int | None, *, behind: bool) -> float | None:
    """Seconds since the oldest unprocessed record was written: 0 with nothing to process,
    None when the broker gave no timestamp for it (unknown is not small)."""
    if not behind:
        return 0.0
    if timestamp_ms is None:
        return None
    return round(max(0.0, now - timestamp_ms / 1000), 3)


def _oldest(ages: Iterable[float | None]) -> float | None:
    known = list(ages)
    if any(age is None for age in known):
        return None
    return max((age for age in known if age is not None), default=0.0)


def _retrying(run: RunRecord) -> str | None:
    """The driver's last error while it restarts its query again and again: a version that
    makes no progress then is stalled, whether or not its batch still looks busy."""
    if run.state.is_active and run.reason and run.reason.startswith("retrying after"):
        return run.reason
    return None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _driver_alive(run: RunRecord, now: float, heartbeat_interval_s: float) -> bool:
    """The process check where the driver runs here; its heartbeats where it runs elsewhere."""
    local = launcher.driver_alive(run)
    if local is not None:
        return local
    if run.heartbeat_at is None:
        return run.state == RunState.STARTING
    return now - run.heartbeat_at.timestamp() < max(30.0, 10 * heartbeat_interval_s)
