"""The sink of a driver's streaming query: each micro-batch is applied to PostgreSQL exactly
once (:mod:`orchestrator.catalog.batches`), and a batch the catalog already holds is not applied
again."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from orchestrator.catalog import events, runs
from orchestrator.catalog.batches import Mover, StaleDriverError, apply_batch, prune
from orchestrator.errors import KappaError
from orchestrator.failpoints import fail_point
from orchestrator.kafka.endpoint import Kafka
from orchestrator.kafka.groups import GroupMirror
from orchestrator.models import DELETE_COLUMN, DeployedVersion, Offsets
from orchestrator.naming import stage_table
from orchestrator.settings import Settings
from orchestrator.spark.checkpoint import Checkpoint
from orchestrator.spark.failures import BatchFailure, is_outage, root_cause
from orchestrator.spark.shape import JobError
from orchestrator.spark.writer import WRITE_RESULT_SCHEMA, connect_catalog, stage_writer

if TYPE_CHECKING:
    from orchestrator.spark.heartbeat import Heartbeat
    from orchestrator.spark.read.sink_reads import SinkReads

log = logging.getLogger("kappa.driver")
_PRUNE_EVERY = 100  # batches between two prunings of the batch records


class BatchCommit:
    """The foreachBatch function: executors stage the batch's output rows, then one catalog
    transaction commits them with the batch's dead letters and offsets.

    ``prepare`` turns the batch's DataFrame into the shaped output (``shape_output``): a batch
    job's transform, or nothing for a stream job, whose transform and shaping are part of the
    streaming query itself.
    """

    def __init__(self, settings: Settings, version: DeployedVersion, attempt: int,
                 conn: psycopg.Connection, prepare: Callable[[Any], Any], kafka: Kafka,
                 checkpoint: Checkpoint, start: Offsets, quarantine: int | None = None):
        self.settings, self.version, self.attempt = settings, version, attempt
        self.conn, self.prepare, self.kafka = conn, prepare, kafka
        self.quarantine = quarantine  # the catalog batch id `kappa restart --quarantine` marked
        self.failure: BatchFailure | None = None  # the last batch that failed, and how often
        self.commits = 0  # batches committed by this driver
        self.heartbeat: Heartbeat | None = None  # told when a batch is in progress
        self.retry_noted = False  # runs.reason says why we retry: clear it after a commit
        # Spark's batch ids start at 0 in every new checkpoint; the catalog's continue.
        self.checkpoint, self.base, self.start = checkpoint, checkpoint.batch_base(), start
        self.conn_dsn = settings.require_services()[0]
        self.mirror = GroupMirror(kafka, version.consumer_group)
        # Off the driver's path: creating a consumer takes tens of milliseconds.
        threading.Thread(target=self._connect_mirror, name="kappa-group-mirror",
                         daemon=True).start()
        self.stale = False
        self.after_handover = False  # set by handover(), until the first micro-batch
        self.reads: SinkReads | None = None  # set per query: the sink reads each batch itself
        spec = version.spec
        self.stage = (settings.data_schema, stage_table(spec.name, spec.version))
        self.columns = (*spec.output_columns, DELETE_COLUMN)

    def __call__(self, df: Any, spark_batch_id: int) -> None:
        if self.after_handover:  # the first micro-batch after a batch phase's tiles
            self.after_handover = False
            fail_point("handover.before_live_batch")
        fail_point("batch.start")
        ckpt = self.checkpoint
        end = ckpt.batch_end_offsets(spark_batch_id)
        if end is None:
            raise KappaError(f"no offset log entry for batch {spark_batch_id} in "
                             f"{ckpt.location}")
        previous = ckpt.batch_end_offsets(spark_batch_id - 1) if spark_batch_id > 0 else None
        start = previous if previous is not None else self.start
        self.apply(df, self.base + spark_batch_id, start, end)
        fail_point("batch.before_spark_commit")

    def handover(self, checkpoint: Checkpoint, start: Offsets) -> None:
        """The streaming query takes over from a batch phase, on ``checkpoint`` seeded at
        ``start`` (resume.resume_point)."""
        self.checkpoint, self.base, self.start = checkpoint, checkpoint.batch_base(), start
        self.after_handover = True

    def apply(self, df: Any, batch_id: int, start: Offsets, end: Offsets) -> None:
        """Apply batch ``batch_id``, [start, end) of the log, exactly once: a micro-batch or a
        batch phase's tile (``df``: its events; a placeholder where ``reads`` reads them)."""
        if self.heartbeat is not None:
            self.heartbeat.busy_since = datetime.now(UTC)
        try:
            self._commit(df, batch_id, start, end)
        except StaleDriverError:
            self.stale = True
            raise
        except Exception as exc:
            if not is_outage(exc):
                before = self.failure
                tries = before.attempts + 1 if before and before.batch_id == batch_id else 1
                self.failure = BatchFailure(batch_id, start, end, root_cause(exc), tries)
            raise
        finally:
            if self.heartbeat is not None:
                self.heartbeat.busy_since = None
        self.failure = None
        self.commits += 1
        # A small batches_kept is kept promptly; a large one costs a pruning per 100 batches.
        if self.commits % max(1, min(_PRUNE_EVERY, self.settings.batches_kept)) == 0:
            folded = prune(self.conn, self.settings.catalog_schema, self.version.id,
                           self.settings.batches_kept)
            if folded:
                log.info("folded %d old batch records into the summary", folded)
            events.prune(self.conn, self.settings.catalog_schema, self.settings.events_kept)
        if self.retry_noted:
            with self.conn.transaction():
                runs.note_reason(self.conn, self.settings.catalog_schema, self.version.id,
                                 self.attempt, None, while_active=True)
            self.retry_noted = False

    def _commit(self, df: Any, batch_id: int, start: Offsets, end: Offsets) -> None:
        if self._already_applied(batch_id):
            if self.version.spec.mode == "stream":
                # The DataFrame is the stateful plan: unless it runs, the state store never
                # writes this batch's version, and Spark refuses the commit (or the next batch
                # finds no state to load). Run it, write nothing.
                df.write.format("noop").mode("overwrite").save()
            log.info("batch %d already applied; skipping its apply", batch_id)
            self._mirror(end)
            return
        began = time.monotonic()
        s = self.settings
        if self.reads is not None:
            df = self.reads.events(df, start, end)
        planned = time.monotonic()
        if batch_id == self.quarantine:
            if self.reads is not None:
                self.reads.finish()  # its files checked before its tries read them
            write_id, staged = None, "several writes"
            mover = self._quarantined(df, batch_id, start, end)
        else:
            write_id = self._stage_checked(df)
            staged, mover = "one write", None
            fail_point("batch.staged")
        ran = time.monotonic()
        result = apply_batch(self.conn, s.catalog_schema, s.data_schema, self.version,
                             self.attempt, batch_id, start, end, write_id, move=mover)
        fail_point("batch.after_pg_commit")
        committed = time.monotonic()
        self._mirror(end)
        seconds = time.monotonic() - began
        log.info("batch %d: %d offsets (%s from the archive), %s staged, %d output rows "
                 "changed, %d dead letters, %d offsets without a record, applied=%s, %.2fs "
                 "(%.0f records/s; read plan %.2fs%s, Spark %.2fs, commit %.2fs, group mirror "
                 "%.2fs)", batch_id, result.records,
                 "?" if result.archived_offsets is None else result.archived_offsets, staged,
                 result.output_rows, result.dead_letters, result.gap_offsets, result.applied,
                 seconds, result.records / seconds if seconds else 0.0, planned - began,
                 _phases(self.reads), ran - planned, committed - ran,
                 time.monotonic() - committed)

    def _stage(self, df: Any) -> str:
        """Transform ``df`` and have the executors COPY its rows into the stage table, under a
        new write id; only one summary row per task comes back."""
        output = self.prepare(df)
        write_id = uuid.uuid4().hex
        output.mapInArrow(stage_writer(self.stage, self.columns, write_id),
                          WRITE_RESULT_SCHEMA).collect()
        return write_id

    def _stage_checked(self, df: Any) -> str:
        """``_stage``; where the sink reads decoded segments, Spark reads them while they are
        checked: one found bad was rebuilt, and the batch is staged again from it."""
        try:
            write_id = self._stage(df)
        except Exception:
            if self.reads is None or not self.reads.finish():
                raise
            rebuilt = True
        else:
            rebuilt = self.reads is not None and self.reads.finish()
        if rebuilt and self.reads is not None:
            log.info("a decoded segment this batch read was rebuilt: staging it again")
            write_id = self._stage(self.reads.again())
        return write_id

    def _quarantined(self, df: Any, batch_id: int, start: Offsets, end: Offsets) -> Mover:
        from orchestrator.spark.quarantine import Quarantine

        s, v = self.settings, self.version
        if v.spec.mode != "batch":
            raise JobError(f"{v.job} {v.version} is a stream job: its records pass through its "
                           "state and cannot be re-run one range at a time; fix the job and "
                           "redeploy it under a new VERSION")
        quarantine = Quarantine(catalog_schema=s.catalog_schema, data_schema=s.data_schema,
                                version=v, batch_id=batch_id, df=df,
                                start=start, end=end, stage=self._stage, kafka=self.kafka)

        def move(conn: psycopg.Connection) -> tuple[int, int]:
            changed, isolated = quarantine(conn)
            runs.set_quarantine_batch(conn, s.catalog_schema, v.id, None)
            events.record(conn, s.catalog_schema, "quarantine", job=v.job, version=v.version,
                          batch=batch_id, tries=quarantine.tries,
                          records=[{"topic": t, "partition": p, "offset": o, "error": e}
                                   for t, p, o, e in quarantine.poison])
            return changed, isolated

        return move

    def reconnect(self) -> None:
        if self.conn.closed or self.conn.broken:
            self.conn = connect_catalog(self.conn_dsn)

    def _connect_mirror(self) -> None:
        try:
            self.mirror.connect()
        except KappaError as exc:  # the first commit tries again
            log.warning("consumer-group mirror %s not connected: %s", self.mirror.group, exc)

    def _mirror(self, end: Offsets) -> None:
        # Best effort: the catalog is the truth, and the next batch commits newer offsets anyway.
        try:
            self.mirror.commit(end)
        except KappaError as exc:
            log.warning("consumer-group mirror %s not updated: %s", self.mirror.group, exc)

    def _already_applied(self, batch_id: int) -> bool:
        with self.conn.transaction():
            row = self.conn.execute(
                psycopg.sql.SQL("SELECT 1 FROM {}.batches WHERE version_id = %s AND batch_id = %s")
                .format(psycopg.sql.Identifier(self.settings.catalog_schema)),
                (self.version.id, batch_id)).fetchone()
        return row is not None


def _phases(reads: SinkReads | None) -> str:
    """The sink's read plan by phase, where the sink read the batch."""
    if reads is None:
        return ""
    return " (" + ", ".join(f"{k} {v:.2f}s" for k, v in reads.phases.items()) + ")"
