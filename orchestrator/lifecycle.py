"""Deploying, stopping and restarting versions: what the facade's lifecycle methods do."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from orchestrator import monitor, reporting
from orchestrator.catalog import events, output, runs, versions
from orchestrator.catalog.batches import gap_to_new_log
from orchestrator.determinism import replay_hazards
from orchestrator.errors import (
    LaunchError,
    LogChangedError,
    NotFoundError,
    ServiceUnavailableError,
    StateError,
)
from orchestrator.jobspec import load_job_file
from orchestrator.lag import (
    LogMismatch,
    log_changed_reason,
    log_mismatches,
    replay_start,
)
from orchestrator.log_identity import log_gone_reason, read_lost_records
from orchestrator.models import (
    DeployedVersion,
    RunRecord,
    VersionStatus,
)
from orchestrator.monitor import fail_on_log_change
from orchestrator.naming import consumer_group, dead_letter_table, output_table
from orchestrator.reporting import _job, _version
from orchestrator.settings import Settings
from orchestrator.spark import launcher
from orchestrator.states import RunState

if TYPE_CHECKING:
    from orchestrator.service import Orchestrator


@dataclass(frozen=True)
class DeployResult:
    created: bool  # False: the same code was already deployed under this label (a no-op)
    status: VersionStatus
    # Constructs that make the output at rest depend on where batches were cut (file:line: why)
    warnings: tuple[str, ...] = ()


def deploy(svc: Orchestrator, job_file: str | Path, *, allow_gap: bool = False) -> DeployResult:
    from orchestrator.kafka.admin import check_access, log_identity, topic_partitions
    from orchestrator.kafka.offsets import log_bounds

    spec = load_job_file(job_file)
    hazards = tuple(replay_hazards(spec))
    s = svc.settings
    _, bootstrap = s.require_services()
    check_access(bootstrap)  # a refused certificate or password, named before anything runs
    with svc._catalog() as conn:
        existing = versions.find(conn, s.catalog_schema, spec.name, spec.version)
        if existing is not None:
            versions.check_same_code(existing, spec)
            if runs.get(conn, s.catalog_schema, existing.id).state == RunState.REGISTERED:
                # Registered by a deploy that crashed before it launched the driver.
                start_driver(svc, conn, existing)
            return DeployResult(False, reporting.status_of(svc, conn, existing), hazards)
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
        start_driver(svc, conn, version)
        # So that a later switch to this version needs no DDL.
        svc._switchboard(conn).refresh_views(spec.name)
        events.prune(conn, s.catalog_schema, s.events_kept)
        return DeployResult(True, reporting.status_of(svc, conn, version), hazards)


def start_driver(svc: Orchestrator, conn: psycopg.Connection, version: DeployedVersion
                 ) -> RunRecord:
    s = svc.settings
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


def stop(svc: Orchestrator, job: str, version: str) -> VersionStatus:
    s = svc.settings
    with svc._catalog() as conn:
        deployed = versions.get(conn, s.catalog_schema, _job(job), _version(version))
        run = runs.get(conn, s.catalog_schema, deployed.id)
        if run.state in (RunState.STOPPED, RunState.RETIRED, RunState.REGISTERED):
            raise StateError(f"{job} {version} is already {run.state.value}: nothing to stop")
        with conn.transaction():
            runs.change_state(conn, s.catalog_schema, deployed, RunState.STOPPED,
                              reason="stopped by `kappa stop`")
        launcher.stop_driver(run)
        return reporting.status_of(svc, conn, deployed)


def stop_all(svc: Orchestrator) -> list[VersionStatus]:
    """Stop every version whose driver should be running (before the services go away)."""
    return [svc.stop(st.job, st.version) for st in svc.status() if st.state.is_active]


def restart(svc: Orchestrator, job: str, version: str, *, allow_gap: bool = False,
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

    s = svc.settings
    with svc._catalog() as conn:
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
        bounds = reporting.bounds_of(svc, deployed)
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
            skip_gap(svc, conn, deployed, mismatches)
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
        start_driver(svc, conn, deployed)
        return reporting.status_of(svc, conn, deployed)


def skip_gap(svc: Orchestrator, conn: psycopg.Connection, v: DeployedVersion,
              mismatches: list[LogMismatch]) -> None:
    """Move the version's position to the log start of each changed partition, and start a
    new checkpoint from the catalog there (the old one is kept aside)."""
    from orchestrator.spark.checkpoint import is_local, set_aside_local

    s = svc.settings
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


def checkpoint_location(settings: Settings, job: str, version: str) -> str:
    from orchestrator.spark.checkpoint import is_local, local_path

    root = settings.checkpoint_root or str(settings.state_dir / "checkpoints")
    if is_local(root):
        return str((local_path(root) / job / version).resolve())
    return f"{root.rstrip('/')}/{job}/{version}"
