"""A Spark Python Data Source that streams Kafka topics through confluent-kafka.

PySpark bundles no Kafka connector and no Maven repository is reachable, so this source reads the
log itself. Offsets are ``{"<topic>": {"<partition>": next offset}}``. Each record becomes one row:
valid events carry their parsed fields, invalid ones their raw bytes and the error, so that the
sink can route them to the dead-letter table and every offset is accounted for.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from orchestrator.lag import split_range, take_records
from orchestrator.parsing import EventParser

SOURCE_NAME = "kappa_kafka"
META_COLUMNS = (
    ("topic", "string", pa.string()),
    ("partition", "int", pa.int32()),
    ("offset", "bigint", pa.int64()),
    ("timestamp_ms", "bigint", pa.int64()),
    ("key", "binary", pa.binary()),
    ("raw", "binary", pa.binary()),
    ("error", "string", pa.string()),
)
_EVENT_TYPES = {
    "long": ("bigint", pa.int64()),
    "string": ("string", pa.string()),
    "double": ("double", pa.float64()),
    "boolean": ("boolean", pa.bool_()),
}
_ROWS_PER_ARROW_BATCH = 20_000


def source_options(*, bootstrap: str, topics: list[str], group_id: str,
                   event_schema: list[tuple[str, str]], non_negative: list[str],
                   start_offsets: dict[str, dict[str, int]], chunk_records: int,
                   max_batch_records: int) -> dict[str, str]:
    return {
        "bootstrap": bootstrap, "topics": json.dumps(topics), "group_id": group_id,
        "event_schema": json.dumps(event_schema), "non_negative": json.dumps(non_negative),
        "start_offsets": json.dumps(start_offsets), "chunk_records": str(chunk_records),
        "max_batch_records": str(max_batch_records),
    }


def _event_schema(options: dict[str, str]) -> list[tuple[str, str]]:
    return [(name, kind) for name, kind in json.loads(options["event_schema"])]


class KafkaRange(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class KafkaLogSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        meta = [f"`{n}` {t}" for n, t, _ in META_COLUMNS]
        fields = [f"`{n}` {_EVENT_TYPES[k][0]}" for n, k in _event_schema(dict(self.options))]
        return ", ".join(meta + fields)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(dict(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]):
        self.options = options
        self.bootstrap = options["bootstrap"]
        self.topics: list[str] = json.loads(options["topics"])
        self.group_id = options["group_id"]
        self.chunk_records = int(options["chunk_records"])
        self.max_batch_records = int(options["max_batch_records"])
        self._probe: Any = None
        self._available_now_end: dict[str, dict[str, int]] | None = None

    # Driver side -------------------------------------------------------------------------
    def _log_ends(self) -> dict[str, dict[str, int]]:
        from orchestrator.kafka.offsets import LogEndProbe

        if self._probe is None:
            self._probe = LogEndProbe(self.bootstrap)
        bounds = self._probe.bounds(self.topics)
        ends: dict[str, dict[str, int]] = {}
        for (topic, partition), (_, end) in bounds.items():
            ends.setdefault(topic, {})[str(partition)] = end
        return ends

    def initialOffset(self) -> dict[str, dict[str, int]]:
        start: dict[str, dict[str, int]] = json.loads(self.options["start_offsets"])
        return start

    def prepareForTriggerAvailableNow(self) -> None:
        # An available-now run stops at the log end seen when it started.
        self._available_now_end = self._log_ends()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_batch_records)

    def latestOffset(self, start: dict[str, dict[str, int]], limit: ReadLimit
                     ) -> dict[str, dict[str, int]]:
        ends = self._available_now_end or self._log_ends()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return take_records(start, ends, max_rows)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return self._log_ends()

    def partitions(self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
                   ) -> list[InputPartition]:
        ranges: list[InputPartition] = []
        for topic, partitions in end.items():
            for partition, stop in partitions.items():
                first = start.get(topic, {}).get(partition, stop)
                for lo, hi in split_range(first, stop, self.chunk_records):
                    ranges.append(KafkaRange(topic, int(partition), lo, hi))
        return ranges

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        # Offsets are committed by the sink, in the same transaction as the output rows.
        pass

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    # Executor side -----------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from orchestrator.kafka.reader import read_range

        assert isinstance(partition, KafkaRange)
        schema = _event_schema(self.options)
        parser = EventParser(schema, json.loads(self.options["non_negative"]))
        arrow_schema = pa.schema(
            [(n, t) for n, _, t in META_COLUMNS] + [(n, _EVENT_TYPES[k][1]) for n, k in schema]
        )
        builder = _BatchBuilder(arrow_schema, partition.topic, partition.partition, len(schema))
        for records in read_range(self.bootstrap, partition.topic, partition.partition,
                                  partition.start, partition.end, self.group_id):
            for offset, timestamp_ms, key, value in records:
                values, error = parser.parse(value)
                builder.add(offset, timestamp_ms, key, value, values, error)
            if builder.size >= _ROWS_PER_ARROW_BATCH:
                yield builder.flush()
        if builder.size:
            yield builder.flush()


class _BatchBuilder:
    """Column lists for one Arrow batch; invalid rows keep their raw bytes, valid ones do not."""

    def __init__(self, schema: pa.Schema, topic: str, partition: int, n_fields: int):
        self.schema, self.topic, self.partition, self.n_fields = schema, topic, partition, n_fields
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.raws: list[bytes | None] = []
        self.errors: list[str | None] = []
        self.fields: list[list[Any]] = [[] for _ in range(self.n_fields)]

    @property
    def size(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None,
            values: tuple[Any, ...] | None, error: str | None) -> None:
        self.offsets.append(offset)
        self.timestamps.append(timestamp_ms)
        self.keys.append(key)
        self.errors.append(error)
        if values is None:
            self.raws.append(value)
            for column in self.fields:
                column.append(None)
        else:
            self.raws.append(None)
            for column, v in zip(self.fields, values, strict=True):
                column.append(v)

    def flush(self) -> pa.RecordBatch:
        n = self.size
        arrays = [
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.int64()),
            pa.array(self.keys, pa.binary()),
            pa.array(self.raws, pa.binary()),
            pa.array(self.errors, pa.string()),
        ] + [pa.array(col, self.schema.field(7 + i).type) for i, col in enumerate(self.fields)]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._reset()
        return batch
