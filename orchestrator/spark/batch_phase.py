"""A batch job's catch-up over decoded segments as plain Spark batch jobs, one tile at a time
(#60), before the streaming query takes over.

A streaming catch-up pays a query start, a column-pruning pass and Spark's offset and commit
logs for batches that the sink reads itself anyway (sink_reads.py). Here the driver plans each
tile, records the plan in the catalog (tile_plans: a retry, in this driver or the next attempt's,
runs the same tile), checks the log as the stream source does, and applies the tile through the
sink's own exactly-once commit (BatchCommit.apply: attempt fence, batch id, contiguity, output,
dead letters, read counts, processed offsets). Tiles stop at the log end seen when the phase
began; the driver then seeds the streaming query's checkpoint from the catalog (the path a lost
checkpoint takes, resume.resume_point) for what the log gained meanwhile, and for live.

A crash anywhere resumes from the catalog: the next driver finds no checkpoint batches and
runs the phase again from the processed offsets, the recorded plan first. A pause by live
first (the run leaves ``replaying``) stops the phase before its next tile is planned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from orchestrator.catalog import runs, tile_plans
from orchestrator.catalog.batches import StaleDriverError, next_batch_id
from orchestrator.catalog.read_accounting import clear_staged_reads
from orchestrator.failpoints import fail_point
from orchestrator.kafka.clients import LogClients
from orchestrator.models import DeployedVersion
from orchestrator.settings import Settings
from orchestrator.spark.batch_commit import BatchCommit
from orchestrator.spark.checkpoint import Checkpoint
from orchestrator.spark.query import JobQuery
from orchestrator.spark.read.sink_reads import SinkReads, union
from orchestrator.spark.resume import checked_bounds, processed_start
from orchestrator.spark.retries import Retries
from orchestrator.tiles import Tile, next_tile, next_tile_records, past_the_log_end

log = logging.getLogger("kappa.driver")


class BatchPhase:
    def __init__(self, settings: Settings, version: DeployedVersion, attempt: int,
                 retries: Retries, log_clients: LogClients, query: JobQuery, sink: BatchCommit):
        self.settings, self.version, self.attempt = settings, version, attempt
        self.retries, self.log_clients = retries, log_clients
        self.query, self.sink = query, sink
        self.tiles = 0  # tiles this driver committed
        self._ceiling: dict[tuple[str, int], int] | None = None  # the log end at the start

    def eligible(self, checkpoint: Checkpoint) -> bool:
        """A batch job whose streaming query has planned no batch yet, and whose catch-up the
        sink would read from decoded segments."""
        return (self.settings.batch_phase and self.version.spec.mode == "batch"
                and not checkpoint.has_batches() and self.query.sink_reads(live=False))

    def run(self, spark: Any) -> None:
        """Commit tiles until the log end seen when the phase began is reached. Raises what a
        tile raised, for the driver's retries (Retries.run_resilient) to judge."""
        s = self.settings
        log.info("this catch-up reads decoded segments with Spark's Parquet reader, as Spark "
                 "batch jobs of up to %d records (the batch phase)", s.decoded_batch_records)
        options = self.query.tile_read_options()
        events = _placeholder(spark, options)
        reads = SinkReads(options, self.query.cores, s.chunk_records, s.catalog_schema,
                          self.version.id, self.query.kafka, self.log_clients.bounds)
        self.sink.reads = reads
        size = s.decoded_batch_records
        try:
            while True:
                tile = self.retries.wait_out_outages(partial(self._plan, size),
                                                     "plan the next tile")
                if tile is None:
                    return
                fail_point("tile.planned")
                began = time.monotonic()
                self.sink.apply(events, tile.batch_id, tile.start, tile.end)
                fail_point("tile.after_pg_commit")
                self.tiles += 1
                size = next_tile_records(tile.records, time.monotonic() - began,
                                         least=min(s.max_batch_records, size),
                                         most=s.decoded_batch_records)
        except StaleDriverError:
            self.sink.stale = True
            raise
        finally:
            reads.close()
            self.sink.reads = None

    def _plan(self, size: int) -> Tile | None:
        """The next tile, recorded before anything of it is read: the recorded plan of the
        next batch if there is one, else a new one of at most ``size`` records; None once
        the phase's end is reached."""
        s, v, conn = self.settings, self.version, self.retries.conn
        schema = s.catalog_schema
        with conn.transaction():
            processed = runs.processed_offsets(conn, schema, v.id)
            batch_id = next_batch_id(conn, schema, v.id)
            plan = tile_plans.planned(conn, schema, v.id, batch_id)
        start = processed_start(v, processed)
        topics = list(v.spec.topics)
        bounds = checked_bounds(conn, s, v, self.query.kafka, processed or start,
                                self.log_clients.bounds(topics), admin=self.log_clients.admin)
        beyond = past_the_log_end(plan.end, bounds) if plan is not None else {}
        if plan is not None and (plan.start != start or beyond):
            log.warning("the plan of tile %d no longer fits the log (%s): planned again",
                        plan.batch_id, beyond or "another start")
            with conn.transaction():
                tile_plans.forget(conn, schema, v.id)
                clear_staged_reads(conn, schema, v.id)
            plan = None
        if plan is not None:
            log.info("tile %d: running its recorded plan again", plan.batch_id)
            return plan
        if self._ceiling is None:
            self._ceiling = {position: end for position, (_, end) in bounds.items()}
        capped = {position: (first, min(end, self._ceiling.get(position, end)))
                  for position, (first, end) in bounds.items()}
        tile = next_tile(batch_id, start, capped, size)
        if tile.records == 0:
            return None
        with conn.transaction():
            tile_plans.record(conn, schema, v, self.attempt, tile)
        return tile


def _placeholder(spark: Any, options: Mapping[str, Mapping[str, str]]) -> Any:
    """An empty DataFrame of the events' columns, as the streaming query's batches have them:
    what a tile with no record to read applies, and what tells SinkReads the columns."""
    from pyspark.sql.types import StructType

    from orchestrator.spark.read.source import KafkaLogSource

    return union([spark.createDataFrame([], StructType.fromDDL(
        KafkaLogSource(dict(topic_options)).schema())) for topic_options in options.values()])
