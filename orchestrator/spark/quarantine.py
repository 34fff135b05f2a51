"""Driver side: re-run a poison batch range by range and isolate the records that fail.

``kappa restart --quarantine`` marks the batch that kept failing. Its commit then runs the
batch's transform on halves of its offset ranges, recursively: a range whose transform and
merge succeed is kept (inside the batch's transaction, under a savepoint), a range that fails is
split again, and a single record that fails goes to the dead-letter table with its error. With
one poison record among n, that is about 2·log2(n) small Spark jobs. The batch then commits as
usual: its other records, its dead letters, its gaps and its offsets, at once.

Only batch jobs (a transform per micro-batch) can be re-run on part of a batch: splitting merges
the parts by the job's MERGE rules, as consecutive batches are merged.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from orchestrator.catalog.batches import move_output
from orchestrator.catalog.db import qualified
from orchestrator.catalog.output import DEAD_LETTER_COLUMNS
from orchestrator.errors import KappaError
from orchestrator.failpoints import fail_point
from orchestrator.kafka.endpoint import Kafka
from orchestrator.models import DeployedVersion, Offsets
from orchestrator.spark.failures import is_outage, root_cause

log = logging.getLogger("kappa.quarantine")

Range = tuple[str, int, int, int]  # topic, partition, first offset, end (exclusive)


class Quarantine:
    """The mover (see ``apply_batch``) of one quarantined batch."""

    def __init__(self, *, catalog_schema: str, data_schema: str, version: DeployedVersion,
                 batch_id: int, df: Any, start: Offsets, end: Offsets,
                 stage: Callable[[Any], str], kafka: Kafka):
        self.catalog_schema = catalog_schema
        self.data_schema, self.version, self.batch_id = data_schema, version, batch_id
        self.df, self.stage, self.kafka = df, stage, kafka
        self.ranges: list[Range] = [
            (t, int(p), start.get(t, {}).get(p, hi), hi)
            for t, ps in sorted(end.items()) for p, hi in sorted(ps.items())
            if start.get(t, {}).get(p, hi) < hi]
        self.poison: list[tuple[str, int, int, str]] = []
        self.changed = 0
        self.tries = 0

    def __call__(self, conn: psycopg.Connection) -> tuple[int, int]:
        # Read the batch once: every try filters the same records.
        self.df = self.df.persist()
        try:
            self._isolate(conn, self.ranges)
        finally:
            self.df.unpersist()
        self._dead_letter(conn)
        log.info("quarantined batch %d: %d tries, %d records isolated: %s", self.batch_id,
                 self.tries, len(self.poison),
                 ", ".join(f"{t}/{p}@{o}" for t, p, o, _ in self.poison))
        return self.changed, len(self.poison)

    def _isolate(self, conn: psycopg.Connection, ranges: list[Range]) -> None:
        size = sum(hi - lo for _, _, lo, hi in ranges)
        if size == 0:
            return
        error = self._try(conn, ranges)
        if error is None:
            return
        if size == 1:
            ((topic, partition, offset, _),) = [r for r in ranges if r[3] > r[2]]
            self.poison.append((topic, partition, offset, error))
            return
        left, right = _halves(ranges)
        self._isolate(conn, left)
        self._isolate(conn, right)

    def _try(self, conn: psycopg.Connection, ranges: list[Range]) -> str | None:
        """Run the transform on ``ranges`` and merge its rows under a savepoint; the error, or
        None if it worked."""
        from pyspark.sql import functions as F

        self.tries += 1
        fail_point("quarantine.try")
        condition = None
        for topic, partition, lo, hi in ranges:
            one = ((F.col("kafka_topic") == topic) & (F.col("kafka_partition") == partition)
                   & (F.col("kafka_offset") >= lo) & (F.col("kafka_offset") < hi))
            condition = one if condition is None else condition | one
        try:
            write_id = self.stage(self.df.where(condition))
        except Exception as exc:
            if is_outage(exc):
                raise
            return root_cause(exc)
        try:
            with conn.transaction():  # a savepoint inside the batch's transaction
                self.changed += move_output(conn, self.data_schema, self.version, self.batch_id,
                                            write_id)
        except KappaError as exc:
            return str(exc)
        except psycopg.Error as exc:  # what PostgreSQL refuses of these rows (a key too long)
            if is_outage(exc):
                raise
            return root_cause(exc)
        return None

    def _dead_letter(self, conn: psycopg.Connection) -> None:
        from orchestrator.kafka.reader import read_range

        rows = []
        group = f"kappa-quarantine-{uuid.uuid4().hex[:12]}"
        for topic, partition, offset, error in self.poison:
            records = [r for batch in read_range(self.kafka, topic, partition, offset,
                                                 offset + 1, group) for r in batch]
            _, timestamp_ms, key, raw = records[0] if records else (offset, None, None, None)
            rows.append((topic, partition, offset, timestamp_ms, key, raw,
                         f"quarantined: {error}", self.version.id, topic, partition))
        if rows:
            # The partition's log epoch, as for every dead letter (see batches.gap_to_new_log).
            epoch = sql.SQL("(SELECT coalesce(max(log_epoch), 0) FROM {} WHERE version_id = %s "
                            "AND topic = %s AND partition = %s)").format(
                qualified(self.catalog_schema, "processed_offsets"))
            with conn.cursor() as cur:
                cur.executemany(sql.SQL("INSERT INTO {} ({}, log_epoch) VALUES ({}, {}) "
                                        "ON CONFLICT DO NOTHING")
                                .format(qualified(self.data_schema, self.version.dead_letter_table),
                                        sql.SQL(", ").join(map(sql.Identifier,
                                                               DEAD_LETTER_COLUMNS)),
                                        sql.SQL(", ").join(sql.Placeholder()
                                                           for _ in DEAD_LETTER_COLUMNS), epoch),
                                rows)


def _halves(ranges: list[Range]) -> tuple[list[Range], list[Range]]:
    """Split ranges into two lists of about half the offsets each."""
    total = sum(hi - lo for _, _, lo, hi in ranges)
    want = total // 2
    left: list[Range] = []
    right: list[Range] = []
    taken = 0
    for topic, partition, lo, hi in ranges:
        if taken >= want:
            right.append((topic, partition, lo, hi))
            continue
        cut = min(hi, lo + (want - taken))
        left.append((topic, partition, lo, cut))
        taken += cut - lo
        if cut < hi:
            right.append((topic, partition, cut, hi))
    return left, right
