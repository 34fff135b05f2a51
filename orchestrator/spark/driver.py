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
from typing import Any

import psycopg

from orchestrator.catalog import runs, versions
from orchestrator.catalog.batches import StaleDriverError, apply_batch
from orchestrator.catalog.output import create_stage
from orchestrator.errors import JobFileError, KappaError
from orchestrator.kafka.groups import GroupMirror
from orchestrator.lag import lag_records
from orchestrator.models import DELETE_COLUMN, KAFKA_COLUMNS, DeployedVersion, Offsets
from orchestrator.naming import stage_table
from orchestrator.schema import parse_ddl
from orchestrator.settings import Settings, load_settings
from orchestrator.spark.checkpoint import batch_end_offsets
from orchestrator.spark.jobcode import load_transform, materialize
from orchestrator.spark.session import build_session
from orchestrator.spark.shape import JobError, shape_output
from orchestrator.spark.source import SOURCE_NAME, KafkaLogSource, source_options
from orchestrator.spark.writer import WRITE_RESULT_SCHEMA, stage_writer
from orchestrator.states import RunState

log = logging.getLogger("kappa.driver")
_MAX_CATCH_UP_ROUNDS = 5
_LIVE_CHUNK = 2**62  # live batches are small: one Spark task per Kafka partition
_BACKOFF_S = (2, 4, 8, 16, 30)
_MAX_QUERY_FAILURES = 10
_FAILURE_WINDOW_S = 600


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
                 conn: psycopg.Connection, prepare: Callable[[Any], Any], bootstrap: str):
        self.settings, self.version, self.attempt = settings, version, attempt
        self.conn, self.prepare = conn, prepare
        self.conn_dsn = settings.require_services()[0]
        self.mirror = GroupMirror(bootstrap, version.consumer_group)
        self.stale = False
        spec = version.spec
        self.stage = (settings.data_schema, stage_table(spec.name, spec.version))
        self.columns = (*spec.output_columns, DELETE_COLUMN)

    def __call__(self, df: Any, batch_id: int) -> None:
        ckpt = self.version.checkpoint_dir
        end = batch_end_offsets(ckpt, batch_id)
        if end is None:
            raise KappaError(f"no offset log entry for batch {batch_id} in {ckpt}")
        previous = batch_end_offsets(ckpt, batch_id - 1) if batch_id > 0 else None
        start = previous if previous is not None else self.version.log_start
        if self._already_applied(batch_id):
            log.info("batch %d already applied; skipping its replay", batch_id)
            self._mirror(end)
            return
        began = time.monotonic()
        output = self.prepare(df)
        write_id = uuid.uuid4().hex
        # Executors COPY their partitions; only one summary row per task comes back.
        written = output.mapInArrow(stage_writer(self.stage, self.columns, write_id),
                                    WRITE_RESULT_SCHEMA).collect()
        try:
            result = apply_batch(self.conn, self.settings.catalog_schema,
                                 self.settings.data_schema, self.version, self.attempt,
                                 batch_id, start, end, write_id)
        except StaleDriverError:
            self.stale = True
            raise
        self._mirror(end)
        seconds = time.monotonic() - began
        log.info("batch %d: %d records, %d rows staged by %d tasks, %d output rows changed, "
                 "%d dead letters, applied=%s, %.2fs (%.0f records/s)", batch_id,
                 result.records, sum(r["rows"] for r in written), len(written),
                 result.output_rows, result.dead_letters, result.applied, seconds,
                 result.records / seconds if seconds else 0.0)

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

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self.stopping.wait(self.settings.heartbeat_interval_s):
            try:
                if conn is None or conn.closed:
                    conn = _connect(self.dsn)
                alive = runs.heartbeat(conn, self.settings.catalog_schema, self.version_id,
                                       self.attempt)
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
        self.dsn, self.bootstrap = settings.require_services()
        self.attempt = attempt
        self.conn = _connect(self.dsn)
        deployed = versions.get(self.conn, settings.catalog_schema, job, version_label)
        self.version = versions.with_code(self.conn, settings.catalog_schema, deployed)

    def set_state(self, target: RunState, reason: str | None = None, **changes: Any) -> None:
        with self.conn.transaction():
            done = runs.change_state(self.conn, self.settings.catalog_schema, self.version,
                                     target, reason=reason, expect_attempt=self.attempt,
                                     **changes)
        if done is None:
            raise StaleDriverError(f"attempt {self.attempt} was replaced; exiting")

    def run(self) -> None:
        s = self.settings
        code = materialize(self.version)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(code), os.environ.get("PYTHONPATH")) if p)
        spark = build_session(s, f"kappa-{self.version.job}-{self.version.version}")
        spark.dataSource.register(KafkaLogSource)
        try:
            self.transform = load_transform(self.version, code, spark)
        except JobFileError as exc:
            raise JobError(str(exc)) from exc
        with self.conn.transaction():
            # Versions deployed before stage tables existed get theirs now.
            create_stage(self.conn, s.data_schema, self.version.spec)
        self.set_state(RunState.REPLAYING, app_id=spark.sparkContext.applicationId)
        heartbeat = Heartbeat(s, self.dsn, self.version.id, self.attempt)
        heartbeat.start()
        sink = BatchCommit(s, self.version, self.attempt, _connect(self.dsn),
                           self._batch_transform if self.version.spec.mode == "batch"
                           else _unchanged, self.bootstrap)

        for round_ in range(_MAX_CATCH_UP_ROUNDS):
            self._run_resilient(spark, sink, live=False)
            try:
                behind = self._lag()
            except KappaError as exc:
                log.warning("cannot measure the lag (%s); going live", exc)
                break
            log.info("catch-up round %d finished; %d records behind the log end", round_, behind)
            if behind <= s.chunk_records:
                break
        self.set_state(RunState.CAUGHT_UP)
        self.set_state(RunState.LIVE)
        self._run_resilient(spark, sink, live=True)

    def _run_resilient(self, spark: Any, sink: BatchCommit, *, live: bool) -> None:
        """Run a query; when it fails (e.g. the broker or PostgreSQL went away for a while),
        restart it from the checkpoint with a growing pause. Exactly-once makes that safe; too
        many failures in ten minutes fail the driver. A mistake in the job's code fails it at
        once: running it again cannot help."""
        failures: list[float] = []
        while True:
            try:
                self._run_query(spark, sink, live=live)
                return
            except Exception as exc:
                if sink.stale or "StaleDriverError" in str(exc):
                    raise
                job_error = _job_error(exc)
                if job_error is not None:
                    raise job_error from exc
                now = time.monotonic()
                failures = [t for t in failures if now - t < _FAILURE_WINDOW_S] + [now]
                if len(failures) > _MAX_QUERY_FAILURES:
                    raise
                delay = _BACKOFF_S[min(len(failures), len(_BACKOFF_S)) - 1]
                log.warning("query failed (%s); restarting it from the checkpoint in %ds "
                            "(%d/%d in %ds)", _first_line(exc), delay, len(failures),
                            _MAX_QUERY_FAILURES, _FAILURE_WINDOW_S)
                time.sleep(delay)
                sink.reconnect()
                self.reconnect()

    def reconnect(self) -> None:
        if self.conn.closed or self.conn.broken:
            self.conn = _connect(self.dsn)

    def _streams(self, spark: Any, *, live: bool) -> dict[str, Any]:
        """One streaming DataFrame per topic, each from its own source."""
        s, v = self.settings, self.version
        streams = {}
        for source in v.spec.inputs:
            options = source_options(
                bootstrap=self.bootstrap, source=source, group_id=v.consumer_group,
                start_offsets=v.log_start, chunk_records=_LIVE_CHUNK if live else s.chunk_records,
                max_batch_records=s.max_batch_records, version_id=v.id,
                catalog_schema=s.catalog_schema)
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
        query.awaitTermination()

    def _lag(self) -> int:
        from orchestrator.kafka.offsets import log_bounds

        with self.conn.transaction():
            processed = runs.processed_offsets(self.conn, self.settings.catalog_schema,
                                               self.version.id)
        bounds = log_bounds(self.bootstrap, list(self.version.spec.topics))
        ends = {key: end for key, (_, end) in bounds.items()}
        return lag_records(processed, ends)


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
        if "JobError:" in line:
            return JobError(line.split("JobError:", 1)[1].strip()[:500])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kappa-driver")
    parser.add_argument("--job", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()
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
