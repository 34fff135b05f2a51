"""What a warm spare runs before a deploy adopts it: a tiny streaming query shaped like a job's.

A Python data source of its own (no broker needed) that yields Arrow batches from two read tasks,
an available-now run with a read limit, a stateful aggregation in RocksDB and a foreachBatch
sink that writes through mapInArrow. It loads the JVM's classes for all of these, starts the
Python processes that look up, create and plan data sources (daemons that later deploys reuse)
and the py4j callback server, and leaves read workers that have imported the log source's
modules and opened their catalog connection.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

# Imported for the read workers that unpickle this module's reader: they import what a job's
# read tasks need once, here, not in the job's first batch (an archived log's modules too).
import orchestrator.archive.parquet_store
import orchestrator.archive.table_checksum
import orchestrator.spark.read.source  # noqa: F401

WARM_UP_SOURCE = "kappa_warm_up"
_ROWS = 64


class WarmUpSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return WARM_UP_SOURCE

    def schema(self) -> str:
        return "kafka_partition int, kafka_offset bigint, url string, duration_ms bigint"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _WarmUpReader()


class _WarmUpReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def initialOffset(self) -> dict[str, int]:
        return {"offset": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(_ROWS)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        return {"offset": min(start["offset"] + _ROWS, 2 * _ROWS)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(part) for part in range(2)] if end != start else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = int(partition.value)
        yield pa.RecordBatch.from_pydict({
            "kafka_partition": pa.array([part] * _ROWS, pa.int32()),
            "kafka_offset": pa.array(range(_ROWS), pa.int64()),
            "url": pa.array([f"/{n % 7}" for n in range(_ROWS)], pa.string()),
            "duration_ms": pa.array(range(_ROWS), pa.int64())})

    def commit(self, end: dict[str, int]) -> None:
        pass


def _connect_and_count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Shaped like the stage write (orchestrator.spark.writer): each read worker opens the
    connection it keeps, as a job's first batch would."""
    from orchestrator.spark.writer import connection

    connection().execute("SELECT 1")
    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})


def _batch(batch: Any, _: int) -> None:
    batch.mapInArrow(_connect_and_count, "rows bigint").collect()


def warm_up(spark: Any, parquet: bool = False) -> None:
    """Run the warm-up query to its end; the session is then as a job's first batch leaves it.
    With ``parquet``, also a scan shaped like a decoded catch-up's (spark/read/sink_reads.py)."""
    from pyspark.sql import functions as f

    spark.dataSource.register(WarmUpSource)
    checkpoint = tempfile.mkdtemp(prefix="kappa-warm-up-")
    try:
        counts = (spark.readStream.format(WARM_UP_SOURCE).load()
                  .groupBy("url").agg(f.count("*").alias("views"),
                                      f.sum("duration_ms").alias("duration_ms")))
        query = (counts.writeStream.outputMode("update")
                 .foreachBatch(_batch)
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        if parquet:
            _read_parquet(spark, checkpoint)
        # The driver side of a deploy, imported now rather than after adoption.
        import orchestrator.spark.driver  # noqa: F401
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)


def _read_parquet(spark: Any, directory: str) -> None:
    """A filtered Parquet scan and aggregation, as a sink reads decoded segments: the
    vectorized reader's classes load now, not in the first batch."""
    import pyarrow.parquet as pq

    path = f"{directory}/decoded.parquet"
    pq.write_table(pa.table({"kafka_partition": pa.array([0] * _ROWS, pa.int32()),
                             "kafka_offset": pa.array(range(_ROWS), pa.int64()),
                             "url": pa.array([f"/{n % 7}" for n in range(_ROWS)]),
                             "duration_ms": pa.array(range(_ROWS), pa.int64()),
                             "_dead": pa.array([n % 9 == 0 for n in range(_ROWS)])}), path)
    (spark.read.schema("kafka_partition int, kafka_offset bigint, url string, "
                       "duration_ms bigint, _dead boolean").parquet(path)
     .where("NOT _dead AND (kafka_partition = 0 AND kafka_offset >= 1 AND kafka_offset < 60)")
     .groupBy("url").count().collect())
