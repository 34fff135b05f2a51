"""Executor side: executors COPY a batch's rows into PostgreSQL themselves.

Neither output rows nor dead letters pass through the driver, so the driver's memory does not
depend on a batch's size, its number of keys or its share of invalid events. Executors write
into stage tables; the driver's commit of the batch (orchestrator.catalog.batches) moves the
rows into the version's tables. The DSN comes from the executor's environment (``KAPPA_PG_DSN``,
set for the executors by the driver's session), never from a plan or a task's arguments.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from orchestrator.settings import DSN_VARIABLE

WRITE_RESULT_SCHEMA = "task bigint, attempt bigint, rows bigint"
_RESULT = pa.schema([("task", pa.int64()), ("attempt", pa.int64()), ("rows", pa.int64())])

# One connection per Python worker: workers are reused across tasks and batches, and a
# connection costs more than a small live batch's COPY.
_connections: dict[str, psycopg.Connection] = {}


def connection() -> psycopg.Connection:
    dsn = os.environ.get(DSN_VARIABLE)
    if not dsn:
        raise RuntimeError(f"{DSN_VARIABLE} is not set on this executor: the driver's session "
                           "passes it to executors (spark.executorEnv); restart the version")
    conn = _connections.get(dsn)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        _connections[dsn] = conn
    return conn


def connect_catalog(dsn: str) -> psycopg.Connection:
    """The driver's own catalog connection (executors use ``connection``)."""
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def copy_rows(conn: psycopg.Connection, table: sql.Composable, columns: Sequence[str],
              rows: Any) -> None:
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
            table, sql.SQL(", ").join(map(sql.Identifier, columns)))) as copy:
        for row in rows:
            copy.write_row(row)


def stage_writer(stage: tuple[str, str], columns: Sequence[str], write_id: str
                 ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function that COPYs one task's rows into the stage table
    ``stage`` = (schema, table) and yields one summary row (task, attempt, rows).

    ``columns`` are the Arrow batches' columns in order: the output columns, then ``_delete``.
    A task's rows commit in one transaction, so a failed task leaves none behind.
    """
    names = (*columns, "_write", "_task", "_attempt")

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId() if context else 0
        # Unique per task attempt in the application, and increasing: the first attempt that
        # committed has the smallest.
        attempt = context.taskAttemptId() if context else 0
        conn = connection()
        table = sql.Identifier(*stage)
        written = 0
        with conn.transaction():
            for batch in batches:
                n = batch.num_rows
                if not n:
                    continue
                values = [column.to_pylist() for column in batch.columns]
                values += [[write_id] * n, [task] * n, [attempt] * n]
                copy_rows(conn, table, names, zip(*values, strict=True))
                written += n
        yield pa.RecordBatch.from_arrays(
            [pa.array([task], pa.int64()), pa.array([attempt], pa.int64()),
             pa.array([written], pa.int64())], schema=_RESULT)

    return write


def stage_dead_letters(catalog_schema: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """COPY dead letters (version_id, topic, partition, offset, timestamp_ms, key, raw, error)
    into the catalog's dead-letter stage, from the task that read them."""
    if not rows:
        return
    conn = connection()
    with conn.transaction():
        copy_rows(conn, sql.Identifier(catalog_schema, "dead_letter_stage"),
                  ("version_id", "topic", "partition", "offset", "timestamp_ms", "key", "raw",
                   "error"), rows)


def stage_read(catalog_schema: str, version_id: int, topic: str, partition: int, start: int,
               end: int, records: int, *, archived_offsets: int = 0,
               decoded_offsets: int = 0) -> None:
    """Record what a read task found in [start, end), how many of its offsets (from
    ``start`` on) the archive served, and how many of those its decoded segments served: the
    commit counts the offsets without a record as gaps."""
    conn = connection()
    conn.execute(sql.SQL("INSERT INTO {} (version_id, topic, partition, range_start, range_end, "
                         "records, archived, archived_offsets, decoded_offsets) "
                         "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)")
                 .format(sql.Identifier(catalog_schema, "read_stage")),
                 (version_id, topic, partition, start, end, records, archived_offsets > 0,
                  archived_offsets, decoded_offsets))
