"""The Spark driver of one job version: ``python -m orchestrator.spark.driver``.

Started detached by the launcher, with settings in its environment (never in argv). It replays the
log with the catch-up profile (available-now runs with chunked ranges) until it has caught up, then
continues as a live streaming query on the same checkpoint. Every micro-batch is applied to
PostgreSQL exactly once by :mod:`orchestrator.catalog.batches`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from orchestrator.catalog import events, runs, versions
from orchestrator.catalog.batches import Mover, StaleDriverError, apply_batch, prune
from orchestrator.catalog.output import create_stage, upgrade_dead_letters
from orchestrator.errors import JobFileError, KappaError
from orchestrator.failpoints import fail_point
from orchestrator.kafka.groups import GroupMirror
from orchestrator.kafka_endpoint import Kafka
from orchestrator.lag import lag_against, log_changed_reason, log_mismatches
from orchestrator.logfile import RotatingLog
from orchestrator.models import DELETE_COLUMN, KAFKA_COLUMNS, DeployedVersion, Offsets
from orchestrator.naming import stage_table
from orchestrator.schema import parse_ddl
from orchestrator.settings import Settings, load_settings
from orchestrator.spark.checkpoint import Checkpoint
from orchestrator.spark.failures import POISON_ATTEMPTS, BatchFailure, is_outage, root_cause
from orchestrator.spark.jobcode import load_transform, materialize
from orchestrator.spark.pyspark_path import WORKER_SITE
from orchestrator.spark.session import build_session, cluster_cores
from orchestrator.spark.shape import JobError, shape_output
from orchestrator.spark.source import SOURCE_NAME, KafkaLogSource, source_options
from orchestrator.spark.writer import WRITE_RESULT_SCHEMA, stage_writer
from orchestrator.states import RunState

log = logging.getLogger("kappa.driver")
T = TypeVar("T")
_MAX_CATCH_UP_ROUNDS = 5
_LIVE_CHUNK = 2**62  # live batches are small: one Spark task per Kafka partition
_BACKOFF_S = (2, 4, 8, 16, 30)  # then 30 s between retries, for as long as it takes
_MAX_QUERY_FAILURES = 10
_FAILURE_WINDOW_S = 600
_PRUNE_EVERY = 100  # batches between two prunings of the batch records
_LAG_CHECK_S = 2.0  # how often a live query not yet caught up measures its lag


def _connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


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
        self.stale = False
        spec = version.spec
        self.stage = (settings.data_schema, stage_table(spec.name, spec.version))
        self.columns = (*spec.output_columns, DELETE_COLUMN)

    def __call__(self, df: Any, spark_batch_id: int) -> None:
        ckpt = self.checkpoint
        end = ckpt.batch_end_offsets(spark_batch_id)
        if end is None:
            raise KappaError(f"no offset log entry for batch {spark_batch_id} in "
                             f"{ckpt.location}")
        previous = ckpt.batch_end_offsets(spark_batch_id - 1) if spark_batch_id > 0 else None
        start = previous if previous is not None else self.start
        batch_id = self.base + spark_batch_id
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
                                 self.attempt, None)
            self.retry_noted = False
        fail_point("batch.before_spark_commit")

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
        if batch_id == self.quarantine:
            write_id, staged = None, "several writes"
            mover = self._quarantined(df, batch_id, start, end)
        else:
            write_id = self._stage(df)
            staged, mover = "one write", None
        result = apply_batch(self.conn, s.catalog_schema, s.data_schema, self.version,
                             self.attempt, batch_id, start, end, write_id, move=mover)
        fail_point("batch.after_pg_commit")
        self._mirror(end)
        seconds = time.monotonic() - began
        log.info("batch %d: %d offsets, %s staged, %d output rows changed, %d dead letters, "
                 "%d offsets without a record, applied=%s, %.2fs (%.0f records/s)", batch_id,
                 result.records, staged, result.output_rows, result.dead_letters,
                 result.gap_offsets, result.applied, seconds,
                 result.records / seconds if seconds else 0.0)

    def _stage(self, df: Any) -> str:
        """Transform ``df`` and have the executors COPY its rows into the stage table, under a
        new write id; only one summary row per task comes back."""
        output = self.prepare(df)
        write_id = uuid.uuid4().hex
        output.mapInArrow(stage_writer(self.stage, self.columns, write_id),
                          WRITE_RESULT_SCHEMA).collect()
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
            self.conn = _connect(self.conn_dsn)

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
                    conn = _connect(self.dsn)
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


class Driver:
    def __init__(self, settings: Settings, job: str, version_label: str, attempt: int):
        self.settings = settings
        self.dsn, self.kafka = settings.require_services()
        self.attempt = attempt
        self.conn = _connect(self.dsn)
        self.caught_up_recorded = False  # whether caught_up was recorded
        self.cores = 1  # known once the session is up
        deployed = versions.get(self.conn, settings.catalog_schema, job, version_label)
        self.version = versions.with_code(self.conn, settings.catalog_schema, deployed)

    def set_state(self, target: RunState, reason: str | None = None, **changes: Any) -> None:
        def change() -> object:
            with self.conn.transaction():
                return runs.change_state(self.conn, self.settings.catalog_schema, self.version,
                                         target, reason=reason, expect_attempt=self.attempt,
                                         **changes)

        if self._wait_out_outages(change, f"record {target.value}") is None:
            raise StaleDriverError(f"attempt {self.attempt} was replaced; exiting")

    def run(self) -> None:
        s = self.settings
        code = materialize(self.version)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(code), WORKER_SITE, os.environ.get("PYTHONPATH")) if p)
        spark = build_session(s, f"kappa-{self.version.job}-{self.version.version}")
        spark.dataSource.register(KafkaLogSource)
        self.cores = cluster_cores(s, spark)
        spark.conf.set("spark.sql.shuffle.partitions", str(self.cores))
        try:
            self.transform = load_transform(self.version, code, spark)
        except JobFileError as exc:
            raise JobError(str(exc)) from exc
        self._wait_out_outages(self._upgrade_tables, "prepare the output tables")
        checkpoint = Checkpoint(self.version.checkpoint_dir, spark)
        self.start_offsets = self._wait_out_outages(lambda: self._resume_point(checkpoint),
                                                    "find where to resume")
        self.quarantine = self._wait_out_outages(self._quarantine_batch, "read the quarantine")
        self.set_state(RunState.REPLAYING, app_id=spark.sparkContext.applicationId)
        heartbeat = Heartbeat(s, self.dsn, self.version.id, self.attempt)
        heartbeat.start()
        sink = BatchCommit(s, self.version, self.attempt, _connect(self.dsn),
                           self._batch_transform if self.version.spec.mode == "batch"
                           else _unchanged, self.kafka, checkpoint, self.start_offsets,
                           quarantine=self.quarantine)
        sink.heartbeat = heartbeat

        behind: int | None = None
        for round_ in range(_MAX_CATCH_UP_ROUNDS):
            self._run_resilient(spark, sink, live=False)
            try:
                # The catalog's outages are waited out here as inside the query; the broker's
                # are not: the live query waits for the broker itself.
                behind = self._lag(wait_for_catalog=True)
            except KappaError as exc:
                log.warning("cannot measure the lag (%s); going live", exc)
                behind = None
                break
            log.info("catch-up round %d finished; %d records behind the log end", round_, behind)
            if behind <= s.chunk_records:
                break
        if behind is not None and behind <= s.max_lag_records:
            self._caught_up(behind)
        else:
            # Caught up is a measurement, not a phase: the live query finishes the catch-up,
            # and the state changes once a measured lag is within the limit.
            log.info("going live %s records behind; caught_up is recorded once the measured lag "
                     "is at most %d", "?" if behind is None else behind, s.max_lag_records)
        self._run_resilient(spark, sink, live=True)

    def _caught_up(self, behind: int) -> None:
        log.info("caught up: %d records behind the log end (at most %d)", behind,
                 self.settings.max_lag_records)
        self.set_state(RunState.CAUGHT_UP)
        self.set_state(RunState.LIVE)
        self.caught_up_recorded = True

    def _check_caught_up(self) -> None:
        """Measured on a timer while the live query runs, not after commits: a log that goes
        quiet brings no commit, and the last measurement may have been unknown."""
        if self.caught_up_recorded:
            return
        try:
            self.reconnect()
            behind = self._lag()
            if behind <= self.settings.max_lag_records:
                self._caught_up(behind)
        except (KappaError, psycopg.Error) as exc:
            if isinstance(exc, StaleDriverError):
                raise
            # The next tick measures again; the query itself is not at fault.
            log.warning("cannot measure the lag (%s)", str(exc).splitlines()[0][:300])

    def _upgrade_tables(self) -> None:
        with self.conn.transaction():
            # Versions deployed before stage tables (and log epochs) existed get them now.
            create_stage(self.conn, self.settings.data_schema, self.version.spec)
            upgrade_dead_letters(self.conn, self.settings.data_schema,
                                 self.version.dead_letter_table)

    def _quarantine_batch(self) -> int | None:
        with self.conn.transaction():
            return runs.quarantine_batch(self.conn, self.settings.catalog_schema,
                                         self.version.id)

    def _wait_out_outages(self, step: Callable[[], T], doing: str) -> T:
        """Run ``step`` until no outage stops it, on a fresh connection after each. A broker
        that comes up after the drivers (a host's reboot) is waited for, however long, as it
        is once the query runs; so is a PostgreSQL that restarts between two of the driver's
        own catalog statements (its connection is then closed under it)."""
        retries = 0
        while True:
            try:
                self.reconnect()
                if retries:  # the noted reason no longer holds (before a step that sets one)
                    self._note_retry(None)
                return step()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if isinstance(exc, psycopg.Error):
                    self.conn.close()  # the next try connects anew
                retries += 1
                delay = _BACKOFF_S[min(retries, len(_BACKOFF_S)) - 1]
                log.warning("cannot %s yet (unreachable service: %s); trying again in %ds "
                            "(retry %d)", doing, root_cause(exc), delay, retries)
                self._note_retry(f"retrying after unreachable service (to {doing}): "
                                 f"{root_cause(exc)}")
                time.sleep(delay)

    def _resume_point(self, checkpoint: Checkpoint) -> Offsets:
        """Where the first batch of a new checkpoint starts, and a refusal when the log or the
        checkpoint no longer fits what the catalog says was applied.

        A checkpoint with batches carries its own start. Without one, a version that applied
        nothing starts at its log start; a batch job that applied batches resumes at the
        catalog's processed offsets (its output holds everything before them); a stream job's
        state lived only in the lost checkpoint, so it cannot go on exactly."""
        from orchestrator.catalog.batches import next_batch_id
        from orchestrator.kafka.offsets import log_bounds

        v = self.version
        with self.conn.transaction():
            processed = runs.processed_offsets(self.conn, self.settings.catalog_schema, v.id)
            next_id = next_batch_id(self.conn, self.settings.catalog_schema, v.id)
        if checkpoint.has_batches():
            start = checkpoint.start_offsets() or v.log_start
        elif next_id == 0:
            start = v.log_start
            checkpoint.start(0, start)
        elif v.spec.mode == "stream":
            raise JobError(
                f"the checkpoint of {v.job} {v.version} ({checkpoint.location}) is gone, and "
                "with it the state of its stream job: its output cannot be continued exactly. "
                "Deploy the job under a new VERSION, which replays from offset 0")
        else:
            log.warning("no checkpoint at %s: resuming from the catalog's processed offsets "
                        "with batch %d", checkpoint.location, next_id)
            start = {t: dict(ps) for t, ps in v.log_start.items()}
            for topic, partitions in processed.items():
                start.setdefault(topic, {}).update(partitions)
            checkpoint.start(next_id, start)
        from orchestrator.kafka.admin import log_identity
        from orchestrator.log_identity import log_gone_reason, replaced

        if v.log_identity is not None:
            topics = list(v.spec.topics)
            gone = replaced(v.log_identity, log_identity(self.kafka, topics), topics)
            if gone:
                raise JobError(log_gone_reason(gone, v.job, v.version))
        bounds = log_bounds(self.kafka, list(v.spec.topics))
        mismatches = log_mismatches(processed or start, bounds)
        if mismatches:
            raise JobError(log_changed_reason(mismatches, v.job, v.version))
        return start

    def _run_resilient(self, spark: Any, sink: BatchCommit, *, live: bool) -> None:
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
                self._run_query(spark, sink, live=live)
                return
            except Exception as exc:
                if sink.commits != commits:  # progress since the last failure: start over
                    retries, commits = 0, sink.commits
                if sink.stale or "StaleDriverError" in str(exc):
                    raise
                job_error = _job_error(exc)
                if job_error is not None:
                    raise job_error from exc
                v = self.version
                poison = sink.failure
                if poison is not None and poison.attempts >= POISON_ATTEMPTS:
                    raise JobError(poison.reason(v.job, v.version)) from exc
                outage = is_outage(exc)
                now = time.monotonic()
                if not outage and poison is None:
                    failures = [t for t in failures if now - t < _FAILURE_WINDOW_S] + [now]
                    if len(failures) > _MAX_QUERY_FAILURES:
                        raise
                retries += 1
                delay = _BACKOFF_S[min(retries, len(_BACKOFF_S)) - 1]
                what = "unreachable service" if outage else "failure"
                log.warning("query failed (%s: %s); restarting it from the checkpoint in %ds "
                            "(retry %d)", what, root_cause(exc), delay, retries)
                sink.retry_noted = self._note_retry(f"retrying after {what}: {root_cause(exc)}")
                time.sleep(delay)
                self._wait_out_outages(sink.reconnect, "reconnect to the catalog")

    def _note_retry(self, reason: str | None) -> bool:
        """Best effort: show why the version makes no progress (`kappa status`), if the catalog
        can be reached at all; None clears it."""
        try:
            self.reconnect()
            with self.conn.transaction():
                runs.note_reason(self.conn, self.settings.catalog_schema, self.version.id,
                                 self.attempt, reason and reason[:500])
        except psycopg.Error:
            self.conn.close()
            return False
        return True

    def reconnect(self) -> None:
        if self.conn.closed or self.conn.broken:
            self.conn = _connect(self.dsn)

    def _streams(self, spark: Any, *, live: bool) -> dict[str, Any]:
        """One streaming DataFrame per topic, each from its own source."""
        s, v = self.settings, self.version
        streams = {}
        for source in v.spec.inputs:
            options = source_options(
                kafka=self.kafka, source=source, group_id=v.consumer_group,
                start_offsets=self.start_offsets,
                chunk_records=_LIVE_CHUNK if live else s.chunk_records,
                max_batch_records=s.max_batch_records, version_id=v.id,
                catalog_schema=s.catalog_schema, job=v.job, version=v.version,
                cores=self.cores, log_identity=v.log_identity)
            streams[source.topic] = spark.readStream.format(SOURCE_NAME).options(**options).load()
        return streams

    def _query(self, spark: Any, *, live: bool) -> tuple[Any, str]:
        """The streaming DataFrame the sink receives, and Spark's output mode."""
        spec = self.version.spec
        streams = self._streams(spark, live=live)
        if spec.mode == "batch":
            # The transform runs per batch, in the sink: the query only reads.
            return _union(list(streams.values())), "append"
        events: Any = streams if spec.per_topic else _union(list(streams.values()))
        try:
            output = self.transform(events)
        except Exception as exc:
            raise JobError(f"{spec.name} {spec.version}: transform() raised "
                           f"{type(exc).__name__}: {_spark_reason(exc)}; fix the job and "
                           "redeploy under a new VERSION") from exc
        if not getattr(output, "isStreaming", False):
            raise JobError(f"{spec.name} {spec.version}: transform() returned a "
                           f"{type(output).__name__} that is not a streaming DataFrame, but "
                           "MODE is \"stream\": build the result from the streaming events it "
                           "gets (no spark.read, collect() or toPandas()), or drop MODE")
        return shape_output(output, spec), ("update" if spec.output_mode == "upsert"
                                            else "append")

    def _batch_transform(self, df: Any) -> Any:
        """A batch job's transform of one micro-batch, given one DataFrame per topic if the
        job declared EVENT_SCHEMAS, shaped for the stage table."""
        from pyspark.sql import functions as F

        spec = self.version.spec
        if not spec.per_topic:
            return shape_output(self.transform(df), spec)
        per_topic = {}
        for source in spec.inputs:
            fields = [name for name, _ in parse_ddl(source.schema).fields]
            per_topic[source.topic] = df.where(F.col("kafka_topic") == source.topic).select(
                *KAFKA_COLUMNS, *fields)
        return shape_output(self.transform(per_topic), spec)

    def _run_query(self, spark: Any, sink: BatchCommit, *, live: bool) -> None:
        s, v = self.settings, self.version
        stream, output_mode = self._query(spark, live=live)
        writer = (stream.writeStream.outputMode(output_mode).foreachBatch(sink)
                  .option("checkpointLocation", v.checkpoint_dir)
                  .queryName(f"{v.job}__{v.version}__{'live' if live else 'catchup'}"))
        if live:
            writer = writer.trigger(processingTime=f"{s.live_trigger_seconds} seconds")
        else:
            writer = writer.trigger(availableNow=True)
        tick = self._check_caught_up if live else None
        try:
            query = writer.start()
        except Exception as exc:
            if "AnalysisException" not in type(exc).__name__:
                raise
            hint = (_OUTPUT_MODE_HINT if "output mode" in str(exc).lower()
                    else "fix transform() and redeploy under a new VERSION")
            raise JobError(f"{v.job} {v.version}: Spark cannot run transform()'s query with "
                           f"OUTPUT_MODE \"{v.spec.output_mode}\": {_spark_reason(exc)}; "
                           f"{hint}") from exc
        try:
            # Raises if the query failed; False while it runs on.
            while not query.awaitTermination(_LAG_CHECK_S):
                if tick is not None:
                    tick()
        except StaleDriverError:
            query.stop()
            raise

    def _lag(self, *, wait_for_catalog: bool = False) -> int:
        from orchestrator.kafka.offsets import log_bounds

        fail_point("driver.measure_lag")

        def processed_offsets() -> Offsets:
            with self.conn.transaction():
                return runs.processed_offsets(self.conn, self.settings.catalog_schema,
                                              self.version.id)

        processed = (self._wait_out_outages(processed_offsets, "read the processed offsets")
                     if wait_for_catalog else processed_offsets())
        return lag_against(processed, log_bounds(self.kafka, list(self.version.spec.topics)))


_OUTPUT_MODE_HINT = ("an aggregation without a watermark needs OUTPUT_MODE \"upsert\"; "
                     "redeploy under a new VERSION")


def _unchanged(df: Any) -> Any:
    return df


def _union(streams: list[Any]) -> Any:
    """One DataFrame of several topics' events; columns a topic lacks are null."""
    first, *rest = streams
    for other in rest:
        first = first.unionByName(other, allowMissingColumns=True)
    return first


def _spark_reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:400]


def _job_error(exc: BaseException) -> JobError | None:
    """A JobError raised in the sink reaches us wrapped in Spark's StreamingQueryException."""
    if isinstance(exc, JobError):
        return exc
    for line in str(exc).splitlines():
        for marker in ("JobError:", "LogChangedError:"):
            if marker in line:
                return JobError(line.split(marker, 1)[1].strip()[:1000])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kappa-driver")
    parser.add_argument("--job", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--log", type=Path, help="the log file, rotated at its size cap")
    args = parser.parse_args(argv)
    settings = load_settings()
    pump = RotatingLog(args.log, settings.driver_log_max_bytes) if args.log else None
    if pump is not None:
        pump.start()
    try:
        return _main(args, settings)
    finally:
        if pump is not None:
            pump.finish()


def _main(args: argparse.Namespace, settings: Settings) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    driver = Driver(settings, args.job, args.version, args.attempt)
    try:
        driver.run()
    except StaleDriverError as exc:
        log.error("%s", exc)
        return 3
    except BaseException as exc:
        reason = _first_line(exc)
        log.exception("driver failed: %s", reason)
        try:
            driver.set_state(RunState.FAILED, reason=reason)
        except Exception:
            log.exception("could not record the failure")
        return 1
    return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "StaleDriverError" in line or "KappaError" in line or "Error" in line:
            return line.strip()[:500]
    return (text.splitlines()[0] if text else type(exc).__name__)[:500]


if __name__ == "__main__":
    sys.exit(main())
