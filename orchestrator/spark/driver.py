"""The Spark driver of one job version: ``python -m orchestrator.spark.driver``.

Started detached by the launcher, with settings in its environment (never in argv). It replays the
log with the catch-up profile (available-now runs with chunked ranges) until it has caught up, then
continues as a live streaming query on the same checkpoint. Every micro-batch is applied to
PostgreSQL exactly once by :mod:`orchestrator.catalog.batches`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import psycopg

from orchestrator.archive.readable import log_bounds_with_archive
from orchestrator.catalog import runs, versions
from orchestrator.catalog.batches import StaleDriverError
from orchestrator.catalog.output import create_stage, upgrade_dead_letters
from orchestrator.errors import JobFileError, KappaError
from orchestrator.failpoints import fail_point
from orchestrator.kafka.clients import LogClients
from orchestrator.lag import lag_against
from orchestrator.logfile import RotatingLog
from orchestrator.models import Offsets
from orchestrator.settings import Settings, load_settings
from orchestrator.spark.batch_commit import BatchCommit
from orchestrator.spark.batch_phase import BatchPhase
from orchestrator.spark.checkpoint import Checkpoint, write_through_filesystem
from orchestrator.spark.failures import first_error_line
from orchestrator.spark.heartbeat import Heartbeat
from orchestrator.spark.jobcode import load_transform, materialize
from orchestrator.spark.query import JobQuery, unchanged
from orchestrator.spark.read.ranges_source import KafkaRangesSource
from orchestrator.spark.read.source import KafkaLogSource
from orchestrator.spark.resume import resume_point
from orchestrator.spark.retries import Retries
from orchestrator.spark.session import build_session, cluster_cores
from orchestrator.spark.shape import JobError
from orchestrator.spark.writer import connect_catalog
from orchestrator.states import Expected, RunState

log = logging.getLogger("kappa.driver")
_MAX_CATCH_UP_ROUNDS = 5


class Driver:
    def __init__(self, settings: Settings, job: str, version_label: str, attempt: int):
        self.settings = settings
        self.dsn, self.kafka = settings.require_services()
        self.attempt = attempt
        conn = connect_catalog(self.dsn)
        self.caught_up_recorded = False  # whether caught_up was recorded
        self.log_clients = LogClients(self.kafka)  # kept: a lag check every 2 s, cheap warm
        deployed = versions.get(conn, settings.catalog_schema, job, version_label)
        self.version = versions.with_code(conn, settings.catalog_schema, deployed)
        self.retries = Retries(settings, self.dsn, conn, self.version, attempt)

    @property
    def conn(self) -> psycopg.Connection:
        """The driver's catalog connection; an outage replaces it."""
        return self.retries.conn

    def set_state(self, *targets: RunState, reason: str | None = None, **changes: Any) -> None:
        """Record each of ``targets`` in turn in one transaction: no reader sees one between."""
        def change() -> object:
            with self.conn.transaction():
                return runs.change_states(self.conn, self.settings.catalog_schema, self.version,
                                          targets, reason=reason,
                                          expected=Expected.driver(self.attempt), **changes)

        if self.retries.wait_out_outages(change, f"record {targets[-1].value}") is None:
            raise StaleDriverError(f"attempt {self.attempt} was replaced, or its run stopped or "
                                   "paused; exiting")

    def run(self, spark: Any | None = None) -> None:
        """Replay, then go live; on ``spark``, a warm spare's session, if one was adopted."""
        s = self.settings
        code = materialize(self.version)
        if spark is None:
            spark = build_session(s, f"kappa-{self.version.job}-{self.version.version}", code)
            spark.dataSource.register(KafkaLogSource)
        spark.dataSource.register(KafkaRangesSource)  # read by the sink (sink_reads.py)
        cores = cluster_cores(s, spark)
        spark.conf.set("spark.sql.shuffle.partitions", str(cores))
        write_through_filesystem(spark, self.version.checkpoint_dir)
        try:
            transform = load_transform(self.version, code, spark)
        except JobFileError as exc:
            raise JobError(str(exc)) from exc
        self.retries.wait_out_outages(self._upgrade_tables, "prepare the output tables")
        checkpoint = Checkpoint(self.version.checkpoint_dir, spark)
        start_offsets = self.retries.wait_out_outages(
            lambda: resume_point(self.conn, s, self.version, self.kafka, checkpoint,
                                 self.log_clients), "find where to resume")
        query = JobQuery(s, self.version, self.kafka, transform, cores, start_offsets)
        quarantine = self.retries.wait_out_outages(
            lambda: runs.quarantine_batch(self.conn, s.catalog_schema, self.version.id),
            "read the quarantine")
        self.set_state(RunState.REPLAYING, app_id=spark.sparkContext.applicationId)
        heartbeat = Heartbeat(s, self.dsn, self.version.id, self.attempt)
        heartbeat.start()
        sink_conn = self.retries.wait_out_outages(lambda: connect_catalog(self.dsn),
                                                  "connect to the catalog")
        sink = BatchCommit(s, self.version, self.attempt, sink_conn,
                           query.batch_transform if self.version.spec.mode == "batch"
                           else unchanged, self.kafka, checkpoint, start_offsets,
                           quarantine=quarantine)
        sink.heartbeat = heartbeat
        phase = BatchPhase(s, self.version, self.attempt, self.retries, self.log_clients, query,
                           sink)
        rounds = _MAX_CATCH_UP_ROUNDS
        behind: int | None = None
        if phase.eligible(checkpoint):
            self.retries.run_resilient(lambda: phase.run(spark), sink)
            fail_point("handover.before_seed")
            query.start_offsets = self.retries.wait_out_outages(
                lambda: resume_point(self.conn, s, self.version, self.kafka, checkpoint,
                                     self.log_clients, after_tiles=True), "seed the checkpoint")
            sink.handover(checkpoint, query.start_offsets)
            behind = self._lag_or_none()
            log.info("batch phase: %d tiles committed; %s records behind the log end",
                     phase.tiles, "?" if behind is None else behind)
            if behind is None or behind <= s.chunk_records:
                rounds = 0  # the live query reads the rest
        for round_ in range(rounds):
            self.retries.run_resilient(lambda: query.run(spark, sink, live=False), sink)
            behind = self._lag_or_none()
            if behind is None:
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
        self.retries.run_resilient(
            lambda: query.run(spark, sink, live=True, tick=self._check_caught_up), sink)

    def _lag_or_none(self) -> int | None:
        """The lag after a catch-up round, or None (going live) where it cannot be measured.
        The catalog's outages are waited out here as inside the query; the broker's are not:
        the live query waits for the broker itself."""
        try:
            return self._lag(wait_for_catalog=True)
        except KappaError as exc:
            log.warning("cannot measure the lag (%s); going live", exc)
            return None

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
            self.retries.reconnect()
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

    def _lag(self, *, wait_for_catalog: bool = False) -> int:
        fail_point("driver.measure_lag")

        def processed_offsets() -> Offsets:
            with self.conn.transaction():
                return runs.processed_offsets(self.conn, self.settings.catalog_schema,
                                              self.version.id)

        processed = (self.retries.wait_out_outages(processed_offsets, "read the processed offsets")
                     if wait_for_catalog else processed_offsets())
        topics = list(self.version.spec.topics)
        # Against the readable log: a partition that retention emptied on the broker still has
        # the archive's records to read.
        bounds = log_bounds_with_archive(self.conn, self.settings, self.version.log_identity,
                                         topics, self.log_clients.bounds(topics))
        return lag_against(processed or self.version.log_start, bounds)


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
        return run_driver(args, settings)
    finally:
        if pump is not None:
            pump.finish()


def run_driver(args: argparse.Namespace, settings: Settings, spark: Any | None = None) -> int:
    """Run the version's driver to its end; its exit status."""
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fail_point("driver.start")
    driver = Driver(settings, args.job, args.version, args.attempt)
    try:
        driver.run(spark)
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
