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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from orchestrator.catalog import runs, versions
from orchestrator.catalog.batches import StaleDriverError
from orchestrator.catalog.output import create_stage, upgrade_dead_letters
from orchestrator.errors import JobFileError, KappaError
from orchestrator.failpoints import fail_point
from orchestrator.kafka.clients import LogClients
from orchestrator.lag import lag_against
from orchestrator.logfile import RotatingLog
from orchestrator.models import KAFKA_COLUMNS, Offsets
from orchestrator.schema import parse_ddl
from orchestrator.settings import Settings, load_settings
from orchestrator.spark.batch_commit import BatchCommit, connect_catalog
from orchestrator.spark.checkpoint import Checkpoint
from orchestrator.spark.failures import (
    POISON_ATTEMPTS,
    first_error_line,
    is_outage,
    job_error,
    root_cause,
    spark_reason,
)
from orchestrator.spark.heartbeat import Heartbeat
from orchestrator.spark.jobcode import load_transform, materialize
from orchestrator.spark.pyspark_path import WORKER_SITE
from orchestrator.spark.resume import resume_point
from orchestrator.spark.session import build_session, cluster_cores
from orchestrator.spark.shape import JobError, shape_output
from orchestrator.spark.source import SOURCE_NAME, KafkaLogSource, source_options
from orchestrator.states import RunState

log = logging.getLogger("kappa.driver")
T = TypeVar("T")
_MAX_CATCH_UP_ROUNDS = 5
_LIVE_CHUNK = 2**62  # live batches are small: one Spark task per Kafka partition
_BACKOFF_S = (2, 4, 8, 16, 30)  # then 30 s between retries, for as long as it takes
_MAX_QUERY_FAILURES = 10
_FAILURE_WINDOW_S = 600
_LAG_CHECK_S = 2.0  # how often a live query not yet caught up measures its lag


class Driver:
    def __init__(self, settings: Settings, job: str, version_label: str, attempt: int):
        self.settings = settings
        self.dsn, self.kafka = settings.require_services()
        self.attempt = attempt
        self.conn = connect_catalog(self.dsn)
        self.caught_up_recorded = False  # whether caught_up was recorded
        self.cores = 1  # known once the session is up
        self.log_clients = LogClients(self.kafka)  # kept: a lag check every 2 s, cheap warm
        deployed = versions.get(self.conn, settings.catalog_schema, job, version_label)
        self.version = versions.with_code(self.conn, settings.catalog_schema, deployed)

    def set_state(self, *targets: RunState, reason: str | None = None, **changes: Any) -> None:
        """Record each of ``targets`` in turn in one transaction: no reader sees one between."""
        def change() -> object:
            with self.conn.transaction():
                return runs.change_states(self.conn, self.settings.catalog_schema, self.version,
                                          targets, reason=reason, expect_attempt=self.attempt,
                                          **changes)

        if self._wait_out_outages(change, f"record {targets[-1].value}") is None:
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
        self.start_offsets = self._wait_out_outages(
            lambda: resume_point(self.conn, s.catalog_schema, self.version, self.kafka,
                                 checkpoint), "find where to resume")
        self.quarantine = self._wait_out_outages(
            lambda: runs.quarantine_batch(self.conn, s.catalog_schema, self.version.id),
            "read the quarantine")
        self.set_state(RunState.REPLAYING, app_id=spark.sparkContext.applicationId)
        heartbeat = Heartbeat(s, self.dsn, self.version.id, self.attempt)
        heartbeat.start()
        sink_conn = self._wait_out_outages(lambda: connect_catalog(self.dsn),
                                           "connect to the catalog")
        sink = BatchCommit(s, self.version, self.attempt, sink_conn,
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
        self.set_state(RunState.CAUGHT_UP, RunState.LIVE)
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
            self.conn = connect_catalog(self.dsn)

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
                           f"{type(exc).__name__}: {spark_reason(exc)}; fix the job and "
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
            hint = ("an aggregation without a watermark needs OUTPUT_MODE \"upsert\"; redeploy "
                    "under a new VERSION" if "output mode" in str(exc).lower()
                    else "fix transform() and redeploy under a new VERSION")
            raise JobError(f"{v.job} {v.version}: Spark cannot run transform()'s query with "
                           f"OUTPUT_MODE \"{v.spec.output_mode}\": {spark_reason(exc)}; "
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
        fail_point("driver.measure_lag")

        def processed_offsets() -> Offsets:
            with self.conn.transaction():
                return runs.processed_offsets(self.conn, self.settings.catalog_schema,
                                              self.version.id)

        processed = (self._wait_out_outages(processed_offsets, "read the processed offsets")
                     if wait_for_catalog else processed_offsets())
        return lag_against(processed, self.log_clients.bounds(list(self.version.spec.topics)))


def _unchanged(df: Any) -> Any:
    return df


def _union(streams: list[Any]) -> Any:
    """One DataFrame of several topics' events; columns a topic lacks are null."""
    first, *rest = streams
    for other in rest:
        first = first.unionByName(other, allowMissingColumns=True)
    return first


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
        reason = first_error_line(exc)
        log.exception("driver failed: %s", reason)
        try:
            driver.set_state(RunState.FAILED, reason=reason)
        except Exception:
            log.exception("could not record the failure")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
