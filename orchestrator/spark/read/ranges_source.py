"""The source's read tasks as a batch read: the ranges of one micro-batch that the sink reads
itself and that no decoded segment serves (spark/read/sink_reads.py), read, parsed and staged by
the streaming source's own ``read``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from orchestrator.archive.coverage import SegmentRef
from orchestrator.spark.read.sink_reads import RANGES_SOURCE
from orchestrator.spark.read.source import KafkaLogSource, KafkaRange, KafkaStreamReader


class KafkaRangesSource(KafkaLogSource):
    @classmethod
    def name(cls) -> str:
        return RANGES_SOURCE

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaRangesReader(dict(self.options))


class KafkaRangesReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [KafkaRange(topic, partition, start, end,
                           tuple(SegmentRef(*ref) for ref in refs), cut)
                for topic, partition, start, end, cut, refs in json.loads(self.options["ranges"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return KafkaStreamReader(self.options).read(partition)

