"""`kappa restart`: a version resumed from its checkpoint, as a plan of named steps.

A version whose log changed under it (a topic recreated, retention past what it read) is
refused, and recorded failed, unless ``allow_gap``: then it resumes at each such partition's
log start, and the event log records the offsets it skipped. A stream job whose checkpoint
(its state) is gone is refused: redeploy it under a new version. ``quarantine``: the next batch
(the one that kept failing) is re-run range by range, and the records that fail go to the
dead-letter table with their error (batch jobs). A catch-up that was not running takes its turn
in the replay queue, like a deploy."""

from __future__ import annotations

import time

import psycopg

from orchestrator.catalog import events, runs, versions
from orchestrator.catalog.access import CatalogAccess
from orchestrator.catalog.batches import gap_to_new_log, next_batch_id
from orchestrator.errors import (
    LogChangedError,
    NotFoundError,
    ServiceUnavailableError,
    StateError,
)
from orchestrator.lag import LogMismatch, log_changed_reason, log_mismatches
from orchestrator.log_identity import LogChange, LogIdentity, log_gone_reason, read_lost_records
from orchestrator.models import Offsets, VersionStatus
from orchestrator.naming import validate_name
from orchestrator.observe import monitor
from orchestrator.replay_queue.launching import start_driver
from orchestrator.replay_queue.slots import start_or_queue
from orchestrator.spark.launch import launcher
from orchestrator.states import RunState
from orchestrator.versions import reporting


def restart(catalog: CatalogAccess, job: str, version: str, allow_gap: bool = False,
            quarantine: bool = False) -> VersionStatus:
    """Resume a version from its checkpoint, replacing its driver if one still runs."""
    with catalog.connection() as conn:
        plan = Restart(catalog, conn, job, version, allow_gap=allow_gap, quarantine=quarantine)
        for step in (plan.refuse_a_retired_version, plan.refuse_a_lost_stream_state,
                     plan.refuse_after_lost_records, plan.stop_the_driver,
                     plan.check_the_log_identity, plan.check_the_log_ranges,
                     plan.skip_the_gap, plan.adopt_the_new_log, plan.quarantine_the_next_batch):
            step()
        plan.start()
        return reporting.status_of(catalog, conn, plan.deployed)


class Restart:
    def __init__(self, catalog: CatalogAccess, conn: psycopg.Connection, job: str, version: str, *,
                 allow_gap: bool, quarantine: bool):
        self.catalog, self.conn = catalog, conn
        self.settings, self.schema = catalog.settings, catalog.settings.catalog_schema
        self.job, self.version = job, version
        self.allow_gap, self.quarantine = allow_gap, quarantine
        self.deployed = versions.get(conn, self.schema, validate_name(job, "job name"),
                                     validate_name(version, "version"))
        self.run = self.run_before = runs.get(conn, self.schema, self.deployed.id)
        with conn.transaction():
            self.processed: Offsets = runs.processed_offsets(conn, self.schema,
                                                             self.deployed.id)
            self.next_batch = next_batch_id(conn, self.schema, self.deployed.id)
        self.identity: LogIdentity | None = None
        self.gone: list[LogChange] = []
        self.mismatches: list[LogMismatch] = []

    def refuse_a_retired_version(self) -> None:
        if self.run.state == RunState.RETIRED:
            raise StateError(f"{self.job} {self.version} is retired: deploy a new version "
                             "instead")

    def refuse_a_lost_stream_state(self) -> None:
        from orchestrator.spark.checkpoint import Checkpoint, is_local

        d = self.deployed
        if (d.spec.mode == "stream" and self.next_batch and is_local(d.checkpoint_dir)
                and not Checkpoint(d.checkpoint_dir).has_batches()):
            raise StateError(
                f"the checkpoint of {self.job} {self.version} ({d.checkpoint_dir}) is gone, "
                "and with it the state of its stream job: its output cannot be continued "
                "exactly. Deploy the job under a new VERSION, which replays from offset 0")

    def refuse_after_lost_records(self) -> None:
        """Its output counts records that the restored log gives to others."""
        if read_lost_records(self.run.reason):
            raise LogChangedError(str(self.run.reason))

    def stop_the_driver(self) -> None:
        launcher.stop_driver(self.run)
        if self.run.state.is_active:
            with self.conn.transaction():
                # Read again under its lock: the driver may have moved on since the first look.
                run = runs.get(self.conn, self.schema, self.deployed.id, for_update=True)
                if run.state.is_active:
                    run = runs.change_state(self.conn, self.schema, self.deployed,
                                            RunState.STOPPED, expected=run.as_seen(),
                                            reason="replaced by `kappa restart`") or run
                self.run = run

    def check_the_log_identity(self) -> None:
        """A topic deleted or recreated, or another cluster, since the version read it."""
        self.identity = monitor.current_identity(self.settings, list(self.deployed.spec.topics))
        self.gone = monitor.log_gone(self.deployed, self.identity)
        if self.gone and not self.allow_gap:
            monitor.fail_on_log_gone(self.conn, self.schema, self.deployed, self.run, self.gone)
            raise LogChangedError(log_gone_reason(self.gone, self.job, self.version))

    def check_the_log_ranges(self) -> None:
        """Retention past what the version read, or a log shorter than it read."""
        d, gone = self.deployed, self.gone
        processed = self.processed or d.log_start
        bounds = monitor.bounds_of(self.settings, d, self.conn)
        self.mismatches = [] if bounds is None else log_mismatches(processed, bounds)
        if gone:
            # The whole of each changed topic (every topic on another cluster) is a new log.
            changed = {c.topic for c in gone} if all(c.topic for c in gone) \
                else set(d.spec.topics)
            self.mismatches = [
                LogMismatch(t, p, processed.get(t, {}).get(str(p), first), first, end,
                            replaced=True)
                for (t, p), (first, end) in sorted((bounds or {}).items()) if t in changed]
            if any(c.kind == "gone" for c in gone):
                raise NotFoundError(log_gone_reason(gone, self.job, self.version))
            if bounds is None:
                raise ServiceUnavailableError(
                    f"the log ends of {', '.join(d.spec.topics)} cannot be read now: "
                    "check the broker, then run the same command again")
        if self.mismatches and not self.allow_gap:
            monitor.fail_on_log_change(self.conn, self.schema, d, self.run, self.processed,
                                       bounds or {})
            raise LogChangedError(log_changed_reason(self.mismatches, self.job, self.version))

    def skip_the_gap(self) -> None:
        """Move the version's position to the log start of each changed partition, and start
        a new checkpoint from the catalog there (the old one is kept aside)."""
        from orchestrator.spark.checkpoint import is_local, set_aside_local

        v, mismatches = self.deployed, self.mismatches
        if not mismatches:
            return
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
        with self.conn.transaction():
            for m in mismatches:
                gap_to_new_log(self.conn, self.schema, v.id, m.topic, m.partition,
                               m.log_start, recreated=m.recreated)
            events.record(self.conn, self.schema, "gap", job=v.job, version=v.version,
                          partitions=[{"topic": m.topic, "partition": m.partition,
                                       "processed": m.processed, "log_start": m.log_start,
                                       "log_end": m.log_end, "recreated": m.recreated}
                                      for m in mismatches],
                          reason=log_changed_reason(mismatches, v.job, v.version),
                          checkpoint_set_aside=aside)

    def adopt_the_new_log(self) -> None:
        """After a gap over a recreated topic, the version reads the new log from now on."""
        if self.gone and self.identity is not None:
            with self.conn.transaction():
                self.deployed = versions.set_log_identity(self.conn, self.schema,
                                                          self.deployed, self.identity)

    def start(self) -> None:
        """A live version, or a catch-up that held a replay slot until now (a driver that
        crashed, one replaced while it ran), starts at once; any other catch-up takes its turn
        in the replay queue, keeping its priority and, if it was queued, its place."""
        run = self.run_before
        if run.caught_up_at is not None or (run.state in (RunState.STARTING,
                                                          RunState.REPLAYING)):
            start_driver(self.catalog, self.conn, self.deployed)
            return
        start_or_queue(self.catalog, self.conn, self.deployed, run.priority,
                       queued_at=run.queued_at if run.state == RunState.QUEUED else None)

    def quarantine_the_next_batch(self) -> None:
        if not self.quarantine:
            return
        if self.deployed.spec.mode != "batch":
            raise StateError(
                f"{self.job} {self.version} is a stream job: its records pass through its "
                "state and cannot be re-run one range at a time; fix the job and redeploy it "
                "under a new VERSION")
        with self.conn.transaction():
            runs.set_quarantine_batch(self.conn, self.schema, self.deployed.id,
                                      self.next_batch)
            events.record(self.conn, self.schema, "quarantine_requested", job=self.job,
                          version=self.version, batch=self.next_batch,
                          previous_reason=self.run.reason)
