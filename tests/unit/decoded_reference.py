"""The per-record parser's reading of archived records, the reference that decoded segments
are checked against, read through Arrow (test_decoded_segments.py) or by Spark
(integration/test_decoded_spark_read.py)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import pyarrow as pa

from orchestrator.archive.decoder import rows_schema
from orchestrator.archive_model.decoding import Decoding
from orchestrator.archive_model.segments import ArchivedRecord
from orchestrator.models import TopicInput
from orchestrator.parsing import EventParser
from orchestrator.schema import parse_ddl
from orchestrator.spark.read.batch_builder import BatchBuilder

TOPIC, PARTITION = "t", 3


def decoding_of(ddl: str, non_negative: Sequence[str] = (), tombstones: str = "dead_letter"
                ) -> Decoding:
    return Decoding.of(TopicInput(TOPIC, parse_ddl(ddl).ddl(), tuple(non_negative), tombstones))


@cache
def schema_of(decoding: Decoding) -> pa.Schema:
    return rows_schema(decoding)


@cache
def parser_of(decoding: Decoding) -> EventParser:
    return EventParser(parse_ddl(decoding.schema), decoding.non_negative)


def per_record(records: Sequence[ArchivedRecord], decoding: Decoding
               ) -> tuple[pa.Table, list[tuple[Any, ...]]]:
    """The reference: each value parsed on its own, the rows and dead letters a read task of
    the Kafka path builds from them."""
    schema, parser = schema_of(decoding), parser_of(decoding)
    builder = BatchBuilder(schema, TOPIC, PARTITION, len(parser.fields),
                           pass_tombstones=decoding.tombstones == "pass", version_id=7,
                           catalog_schema="c")
    batches = []
    for i, (offset, timestamp_ms, _, key, value, headers) in enumerate(records):
        values, error = parser.parse(value)
        builder.add(offset, timestamp_ms, key, value, headers, values, error)
        if i % 5 == 4:  # several batches, as a read task yields them
            batches.append(builder.flush())
    batches.append(builder.flush())
    return pa.Table.from_batches(batches, schema=schema), [d[3:] for d in builder.dead]


def canonical(value: Any) -> Any:
    """``value`` with every float made comparable bit for bit: NaN equals NaN, and -0.0 is not
    0.0."""
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(map(canonical, value))
    return value
