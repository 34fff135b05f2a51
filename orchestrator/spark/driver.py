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
import types
from typing import Any

import psycopg

from orchestrator.catalog import runs, versions
from orchestrator.catalog.batches import StaleDriverError, apply_batch, total_records
from orchestrator.catalog.output import DEAD_LETTER_COLUMNS
from orchestrator.errors import KappaError
from orchestrator.kafka.groups import GroupMirror
from orchestrator.lag import lag_records
from orchestrator.models import DeployedVersion, Offsets
from orchestrator.settings import Settings, load_settings
from orchestrator.spark.checkpoint import batch_end_offsets
from orchestrator.spark.session import build_session
from orchestrator.spark.source import SOURCE_NAME, KafkaLogSource, source_options
from orchestrator.states import RunState

log = logging.getLogger("kappa.driver")
_MAX_CATCH_UP_ROUNDS = 5
_LIVE_CHUNK = 2**62  # live batches are small: one Spark task per Kafka partition
_BACKOFF_S = (2, 4, 8, 16, 30)
_MAX_QUERY_FAILURES = 10
_FAILURE_WINDOW_S = 600


def _connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def load_transform(version: DeployedVersion) -> Any:
    """Run the deployed source stored in the catalog, not the file, which may have changed."""
    module = types.ModuleType(f"kappa_job_{version.job}_{version.version}")
    module.__file__ = version.spec.path
    code = compile(version.spec.source, f"{version.spec.path} (deployed)", "exec")
    exec(code, module.__dict__)
    return module.transform


class BatchSink:
    """The foreachBatch function: transform, then commit rows, dead letters and offsets at once."""

    def __init__(self, settings: Settings, version: DeployedVersion, attempt: int,
                 conn: psycopg.Connection, transform: Any, bootstrap: str):
        self.settings, self.version, self.attempt = settings, version, attempt
        self.conn, self.transform = conn, transform
        self.conn_dsn = settings.require_services()[0]
        self.mirror = GroupMirror(bootstrap, version.consumer_group)
        self.stale = False

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

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
        spec = self.version.spec
        # One pass over the batch: dead letters (rare) ride along as an observed metric of the
        # output query, instead of caching the batch or reading it twice.
        observed = Observation(f"kappa_batch_{batch_id}")
        dead_struct = F.struct(*[F.col(c) for c in DEAD_LETTER_COLUMNS])
        watched = df.observe(
            observed,
            F.count(F.lit(1)).alias("rows"),
            F.collect_list(F.when(F.col("error").isNotNull(), dead_struct)).alias("dead"),
        )
        valid = watched.where(F.col("error").isNull()).select(*[n for n, _ in spec.event_schema])
        output = self.transform(valid).select(*spec.output_columns)
        rows = [tuple(r) for r in output.collect()]
        metrics = observed.get
        # A re-executed stage can report a row twice: the dead-letter key is the offset.
        dead = list({(r[0], r[1], r[2]): tuple(r) for r in metrics["dead"]}.values())
        expected = total_records(start, end)
        if metrics["rows"] != expected:
            log.warning("batch %d: read %d records for an offset range of %d", batch_id,
                        metrics["rows"], expected)
        try:
            result = apply_batch(self.conn, self.settings.catalog_schema,
                                 self.settings.data_schema, self.version, self.attempt,
                                 batch_id, start, end, rows, dead)
        except StaleDriverError:
            self.stale = True
            raise
        self._mirror(end)
        seconds = time.monotonic() - began
        log.info("batch %d: %d records, %d output rows, %d dead letters, applied=%s, "
                 "%.2fs (%.0f records/s)", batch_id, result.records, result.output_rows,
                 result.dead_letters, result.applied, seconds,
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
        self.version = versions.get(self.conn, settings.catalog_schema, job, version_label)

    def set_state(self, target: RunState, reason: str | None = None, **changes: Any) -> None:
        with self.conn.transaction():
            done = runs.change_state(self.conn, self.settings.catalog_schema, self.version,
                                     target, reason=reason, expect_attempt=self.attempt,
                                     **changes)
        if done is None:
            raise StaleDriverError(f"attempt {self.attempt} was replaced; exiting")

    def run(self) -> None:
        s = self.settings
        spark = build_session(s, f"kappa-{self.version.job}-{self.version.version}")
        spark.dataSource.register(KafkaLogSource)
        self.set_state(RunState.REPLAYING, app_id=spark.sparkContext.applicationId)
        heartbeat = Heartbeat(s, self.dsn, self.version.id, self.attempt)
        heartbeat.start()
        sink = BatchSink(s, self.version, self.attempt, _connect(self.dsn),
                         load_transform(self.version), self.bootstrap)

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

    def _run_resilient(self, spark: Any, sink: BatchSink, *, live: bool) -> None:
        """Run a query; when it fails (e.g. the broker or PostgreSQL went away for a while),
        restart it from the checkpoint with a growing pause. Exactly-once makes that safe; too
        many failures in ten minutes fail the driver."""
        failures: list[float] = []
        while True:
            try:
                self._run_query(spark, sink, live=live)
                return
            except Exception as exc:
                if sink.stale or "StaleDriverError" in str(exc):
                    raise
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

    def _run_query(self, spark: Any, sink: BatchSink, *, live: bool) -> None:
        s, v = self.settings, self.version
        options = source_options(
            bootstrap=self.bootstrap, topics=list(v.spec.topics), group_id=v.consumer_group,
            event_schema=list(v.spec.event_schema), non_negative=list(v.spec.non_negative),
            start_offsets=v.log_start, chunk_records=_LIVE_CHUNK if live else s.chunk_records,
            max_batch_records=s.max_batch_records,
        )
        writer = (spark.readStream.format(SOURCE_NAME).options(**options).load()
                  .writeStream.foreachBatch(sink).option("checkpointLocation", v.checkpoint_dir)
                  .queryName(f"{v.job}__{v.version}__{'live' if live else 'catchup'}"))
        if live:
            writer = writer.trigger(processingTime=f"{s.live_trigger_seconds} seconds")
        else:
            writer = writer.trigger(availableNow=True)
        query = writer.start()
        query.awaitTermination()

    def _lag(self) -> int:
        from orchestrator.kafka.offsets import log_bounds

        with self.conn.transaction():
            processed = runs.processed_offsets(self.conn, self.settings.catalog_schema,
                                               self.version.id)
        bounds = log_bounds(self.bootstrap, list(self.version.spec.topics))
        ends = {key: end for key, (_, end) in bounds.items()}
        return lag_records(processed, ends)


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
