"""Decoded segments read by Spark's own Parquet reader, as the sink reads them in a batch phase
(spark/read/sink_reads.py ``decoded_frame``), against the per-record parser (#60, item 5).

tests/unit/test_decoded_segments.py checks the decode against the parser through Arrow
(``split_decoded``, what the source's read tasks use). A batch phase reads the same files in the
JVM instead: its schema string, its offset filter and Spark's mapping of Parquet types are a
second reading that those tests never run. Here Hypothesis draws job schemas with nested,
timestamp, date, decimal, double and ``_dead``-like field names, and records of every kind of
valid and invalid event; each segment is decoded and written as the archiver writes it, Spark
reads a range of it, and the sink's dead-letter rows are taken from the file. Both must equal
what the parser gives record by record, value for value.

One Spark session (local, one core) serves every example: a JVM per example would cost more
than the whole module."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unit.decoded_reference import PARTITION, TOPIC, canonical, decoding_of, per_record
from unit.event_strategies import FLAT, NARROW, NEAR_RESERVED, NESTED, _segments

pytestmark = [pytest.mark.integration, pytest.mark.spark]
_DEAD_LETTER_COLUMNS = ["kafka_offset", "kafka_timestamp", "_dead", "_dead_reason",
                        "_dead_key", "_dead_value"]
# Each example is a Spark job: fewer than the Arrow path's own properties, which cover the
# decode's cuts and chunks; these cover the JVM's reading of what the decode wrote.
_SETTINGS = settings(max_examples=8, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.function_scoped_fixture])
_FILES = itertools.count()


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from orchestrator.settings import load_settings
    from orchestrator.spark.session import spark_conf

    work = tmp_path_factory.mktemp("decoded-spark")
    conf = spark_conf(load_settings({"state_dir": str(work)}, cwd=work), "kappa-test-decoded")
    builder = SparkSession.builder
    for key, value in conf.items():  # the drivers' conf: time zone, redaction, readers
        builder = builder.config(key, value)
    session = (builder.master("local[1]").config("spark.driver.memory", "512m")
               .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    try:
        yield session
    finally:
        session.stop()


def _spark_read_the_same(spark: Any, directory: Path, segment: tuple[list[Any], int, int, int],
                         ddl: str, non_negative: tuple[str, ...] = (),
                         tombstones: str = "dead_letter") -> None:
    from pyspark.sql.types import StructType

    from orchestrator.archive.decode_pass import read_decoded
    from orchestrator.archive.decoder import decode, file_checksum, rows_schema
    from orchestrator.archive.parquet_store import ParquetStore, parquet_bytes, to_table
    from orchestrator.spark.read.sink_reads import dead_letter_rows, decoded_frame
    from orchestrator.spark.read.source import KafkaLogSource

    records, start, end, _ = segment
    decoding = decoding_of(ddl, non_negative, tombstones)
    # Written as the decode pass writes a segment (decode_pass.py).
    data = parquet_bytes(decode(to_table(records), decoding, TOPIC, PARTITION),
                         plain=("kafka_offset", "kafka_timestamp"))
    name = f"{next(_FILES)}.parquet"
    (directory / name).write_bytes(data)
    # A task's bounds are offsets of the log: never below 0, never past the largest long.
    lo, hi = max(start, 0), min(end, 2**63 - 1)
    source = StructType.fromDDL(KafkaLogSource({"schema": decoding.schema}).schema())
    # The file's extent, as a segment's reference gives it: a range that holds it whole
    # is read with no offset filter, any other through the filter.
    first, last = (records[0][0], records[-1][0] + 1) if records else (lo, lo)
    frame = decoded_frame(spark, {str(directory / name): (PARTITION, first, last)},
                          decoding.schema, source, TOPIC, {PARTITION: [(lo, hi)]})
    kept = [r for r in records if lo <= r[0] < hi]
    expected_rows, expected_dead = per_record(kept, decoding)
    schema = rows_schema(decoding)
    got = frame.toArrow()
    assert [f.name for f in got.schema] == schema.names
    for theirs, ours in zip(got.schema, schema, strict=True):
        assert theirs.type == ours.type, (theirs, ours)  # no cast hides a type Spark changed
    rows = pa.Table.from_batches(got.to_batches(), schema=got.schema).cast(schema)
    rows = rows.sort_by("kafka_offset")  # Spark keeps no order
    assert canonical(rows.to_pylist()) == canonical(expected_rows.to_pylist())
    letters = read_decoded(ParquetStore(str(directory)), name, file_checksum(data),
                           _DEAD_LETTER_COLUMNS)
    dead = dead_letter_rows(letters.filter(letters.column("_dead")), 7, TOPIC, PARTITION, lo, hi)
    assert [d[3:] for d in dead] == expected_dead
    assert rows.num_rows + len(dead) == len(kept)


@_SETTINGS
@given(segment=_segments(FLAT), non_negative=st.sampled_from([(), ("duration_ms",)]))
def test_property_flat_events_read_by_spark_from_decoded_segments_as_parsed_one_by_one(
        spark: Any, tmp_path: Path, segment: Any, non_negative: tuple[str, ...]) -> None:
    _spark_read_the_same(spark, tmp_path, segment, FLAT, non_negative)


@_SETTINGS
@given(segment=_segments(NARROW), tombstones=st.sampled_from(["dead_letter", "pass"]))
def test_property_narrow_integers_and_booleans_read_by_spark_the_same(
        spark: Any, tmp_path: Path, segment: Any, tombstones: str) -> None:
    _spark_read_the_same(spark, tmp_path, segment, NARROW, ("tiny", "n"), tombstones)


@_SETTINGS
@given(segment=_segments(NESTED))
def test_property_nested_timestamp_date_decimal_and_double_fields_read_by_spark_the_same(
        spark: Any, tmp_path: Path, segment: Any) -> None:
    _spark_read_the_same(spark, tmp_path, segment, NESTED)


@_SETTINGS
@given(segment=_segments(NEAR_RESERVED))
def test_property_fields_named_like_the_dead_letter_columns_read_by_spark_the_same(
        spark: Any, tmp_path: Path, segment: Any) -> None:
    _spark_read_the_same(spark, tmp_path, segment, NEAR_RESERVED, ("dead",))
