"""Archived records parsed into rows and dead letters, and raw segments decoded once into typed
Parquet (pyarrow; no pyspark: the archiver and the read tasks both run it).

``parsed_chunks`` is the one parse of archived records: a read task that reads a raw segment
calls it, and so does the decoder that writes a decoded segment. The decoded segment is then
that parse's result kept as it is, so reading it gives, by construction, the rows and dead
letters a read of the raw segment gives (the differential test holds the two to it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.archive_model.decoding import Decoding
from orchestrator.models import DEAD, DEAD_KEY, DEAD_REASON, DEAD_VALUE
from orchestrator.parsing import EventParser
from orchestrator.record_parsers import RecordParser, WriterSchemas, record_parser
from orchestrator.schema import parse_ddl
from orchestrator.spark.read.arrow import arrow_fields
from orchestrator.spark.read.batch_builder import KAFKA_FIELDS, ROWS_PER_ARROW_BATCH, BatchBuilder
from orchestrator.spark.read.columnar import ColumnarParser, DeadRecord

__all__ = ["decode", "decoded_schema", "parsed_chunks", "read_columns", "rows_schema",
           "split_decoded", "writer_ids"]

WRITER_IDS_KEY = b"kappa.writer_schema_ids"
_DEAD_COLUMNS = (pa.field(DEAD_REASON, pa.string()), pa.field(DEAD_KEY, pa.binary()),
                 pa.field(DEAD_VALUE, pa.binary()))


def rows_schema(decoding: Decoding) -> pa.Schema:
    """The read tasks' batches: the Kafka metadata columns, then the declared fields."""
    return pa.schema([*KAFKA_FIELDS, *arrow_fields(parse_ddl(decoding.schema))])


def decoded_schema(decoding: Decoding) -> pa.Schema:
    """A decoded segment's columns: the rows' without the topic (the lineage's name), then
    whether the record is a dead letter and, if so, its reason, key and value."""
    kept = list(rows_schema(decoding))[1:]
    return pa.schema([*kept, pa.field(DEAD, pa.bool_(), False), *_DEAD_COLUMNS])


def parsed_chunks(table: pa.Table, decoding: Decoding, topic: str, partition: int,
                  wanted: frozenset[str] | None = None, registry: WriterSchemas | None = None,
                  writer_ids: set[int] | None = None
                  ) -> Iterator[tuple[pa.RecordBatch, list[DeadRecord]]]:
    """The rows (``rows_schema``, the columns not ``wanted`` null) and dead letters of archived
    records (parquet_store.SCHEMA), a chunk at a time, in offset order. Avro and Protobuf
    values are read with the schema registry's writer schemas (``registry``), and the ids met
    are added to ``writer_ids``; only JSON has the columnar fast paths."""
    from orchestrator.archive.parquet_store import as_records
    from orchestrator.spark.read.arrow_events import ArrowEventParser

    schema = parse_ddl(decoding.schema)
    pass_tombstones = decoding.tombstones == "pass"
    parser: RecordParser
    if decoding.format.kind == "json":
        parser = json_parser = EventParser(schema, decoding.non_negative)
        columnar = ColumnarParser.for_schema(schema, json_parser, decoding.non_negative,
                                             pass_tombstones)
    else:
        parser = record_parser(schema, decoding.non_negative, decoding.format, registry)
        columnar = None
    batches = rows_schema(decoding)
    arrow = None if columnar is None else ArrowEventParser(columnar, batches, topic, partition,
                                                           wanted)
    for at in range(0, table.num_rows, ROWS_PER_ARROW_BATCH):
        chunk = table.slice(at, ROWS_PER_ARROW_BATCH)
        if arrow is not None:  # Arrow to Arrow: no Python object per record
            yield arrow.parse(chunk)
            continue
        builder = BatchBuilder(batches, topic, partition, len(parser.fields),
                               pass_tombstones=pass_tombstones, version_id=0, catalog_schema="",
                               wanted=wanted)
        for offset, timestamp_ms, key, value, headers in as_records(chunk):
            values, error = parser.parse(value)
            builder.add(offset, timestamp_ms, key, value, headers, values, error)
        if writer_ids is not None:
            writer_ids |= parser.writer_ids
        yield builder.flush(), [d[3:] for d in builder.dead]  # without (version, topic, part.)


def decode(raw: pa.Table, decoding: Decoding, topic: str, partition: int,
           registry: WriterSchemas | None = None) -> pa.Table:
    """A raw segment's records as a decoded segment: one row per record, in offset order; an
    Avro or Protobuf one records the writer schema ids it met (``writer_ids``)."""
    schema = decoded_schema(decoding)
    parts: list[pa.Table] = []
    met: set[int] = set()
    for batch, dead in parsed_chunks(raw, decoding, topic, partition, registry=registry,
                                     writer_ids=met):
        rows = pa.Table.from_batches([batch]).drop_columns(["kafka_topic"])
        n = rows.num_rows
        rows = rows.append_column(schema.field(DEAD), pa.array(np.zeros(n, bool)))
        for field in _DEAD_COLUMNS:
            rows = rows.append_column(field, pa.nulls(n, field.type))
        parts.append(rows)
        if dead:
            parts.append(_dead_table(dead, partition, schema))
    decoded = pa.concat_tables(parts).sort_by("kafka_offset").combine_chunks() if parts \
        else schema.empty_table()
    if decoding.format.kind == "json":
        return decoded
    return decoded.replace_schema_metadata(
        {WRITER_IDS_KEY: json.dumps(sorted(met), separators=(",", ":"))})


def writer_ids(decoded: pa.Table | pa.Schema) -> list[int] | None:
    """The writer schema ids a decoded segment met; None for JSON (no registry)."""
    found = (decoded.schema if isinstance(decoded, pa.Table) else decoded).metadata or {}
    ids = found.get(WRITER_IDS_KEY)
    return None if ids is None else [int(i) for i in json.loads(ids)]


def _dead_table(dead: list[DeadRecord], partition: int, schema: pa.Schema) -> pa.Table:
    n = len(dead)
    offsets, timestamps, keys, values, errors = zip(*dead, strict=True)
    columns = {
        "kafka_partition": pa.array(np.full(n, partition, np.int32)),
        "kafka_offset": pa.array(offsets, pa.int64()),
        "kafka_timestamp": pa.array(timestamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC")),
        DEAD: pa.array(np.ones(n, bool)),
        DEAD_REASON: pa.array(errors, pa.string()),
        DEAD_KEY: pa.array(keys, pa.binary()),
        DEAD_VALUE: pa.array(values, pa.binary()),
    }
    return pa.table([columns.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)


def read_columns(schema: pa.Schema) -> list[str]:
    """The columns of a decoded segment that ``split_decoded`` needs for batches of
    ``schema``."""
    return [*(n for n in schema.names if n != "kafka_topic"
              and n not in ("kafka_offset", "kafka_timestamp")),
            "kafka_offset", "kafka_timestamp", DEAD, *(f.name for f in _DEAD_COLUMNS)]


def split_decoded(table: pa.Table, topic: str, start: int, end: int, schema: pa.Schema
                  ) -> tuple[pa.Table, list[DeadRecord]]:
    """The rows of [start, end) of a decoded segment in ``schema`` (the read tasks' columns,
    of ``rows_schema``), and its dead letters as the parser gave them."""
    offsets = table.column("kafka_offset").to_numpy()
    lo, hi = (int(i) for i in offsets.searchsorted([start, end]))
    part = table.slice(lo, hi - lo)
    dead_mask = part.column(DEAD)
    dead: list[DeadRecord] = []
    if pc.any(dead_mask).as_py():
        letters = part.filter(dead_mask)
        stamps = letters.column("kafka_timestamp").cast(pa.int64()).to_numpy() // 1000
        dead = list(zip(letters.column("kafka_offset").to_pylist(), stamps.tolist(),
                        letters.column(DEAD_KEY).to_pylist(),
                        letters.column(DEAD_VALUE).to_pylist(),
                        letters.column(DEAD_REASON).to_pylist(), strict=True))
        part = part.filter(pc.invert(dead_mask))
    n = part.num_rows
    topics = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                            pa.array([topic])).cast(pa.string())
    return pa.table([topics if f.name == "kafka_topic" else part.column(f.name)
                     for f in schema], schema=schema), dead


def file_checksum(data: bytes | pa.Buffer) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()
