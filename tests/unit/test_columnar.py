"""The columnar parse path of the Kafka source gives exactly what the per-record path gives."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.parsing import EventParser
from orchestrator.samples.sample import sample_events
from orchestrator.schema import INTEGER_BITS, Primitive, Struct, from_flat, parse_ddl
from orchestrator.spark.read import source
from orchestrator.spark.read.arrow import arrow_fields
from orchestrator.spark.read.batch_builder import _HEADER, KAFKA_FIELDS, BatchBuilder, kafka_arrays
from orchestrator.spark.read.columnar import ColumnarParser

Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]
FLAT_TYPES = ("bigint", "int", "smallint", "tinyint", "string", "boolean")
TOPIC, PARTITION, VERSION_ID = "events", 3, 7


def _builder(schema: Struct, pass_tombstones: bool) -> BatchBuilder:
    return BatchBuilder(pa.schema([*KAFKA_FIELDS, *arrow_fields(schema)]), TOPIC, PARTITION,
                         len(schema.fields), pass_tombstones=pass_tombstones,
                         version_id=VERSION_ID, catalog_schema="unused")


def _per_record(schema: Struct, non_negative: list[str], pass_tombstones: bool,
                records: list[Record]) -> tuple[pa.RecordBatch, list[tuple[Any, ...]]]:
    parser = EventParser(schema, non_negative)
    builder = _builder(schema, pass_tombstones)
    for offset, timestamp_ms, key, value, headers in records:
        values, error = parser.parse(value)
        builder.add(offset, timestamp_ms, key, value, headers, values, error)
    return builder.flush(), builder.dead


def _columnar(schema: Struct, non_negative: list[str], pass_tombstones: bool,
              chunks: list[list[Record]], per_record_above: float,
              ) -> tuple[pa.RecordBatch, list[tuple[Any, ...]]]:
    parser = ColumnarParser.for_schema(schema, EventParser(schema, non_negative), non_negative,
                                       pass_tombstones)
    assert parser is not None
    parser.PER_RECORD_ABOVE = per_record_above
    builder = _builder(schema, pass_tombstones)
    for chunk in chunks:
        builder.extend(*parser.parse(chunk))  # type: ignore[arg-type]
    return builder.flush(), builder.dead


# Generated records ------------------------------------------------------------------------

KINDS = ("valid", "bad_field", "missing", "null", "not_json", "not_object", "tombstone")


def _valid(t: str) -> st.SearchStrategy[Any]:
    if t == "string":
        return st.text(max_size=5)
    if t == "boolean":
        return st.booleans()
    half = 2 ** (INTEGER_BITS[t] - 1)
    return st.sampled_from([-half, -1, 0, 1, half - 1]) | st.integers(-half, half - 1)


def _invalid(t: str) -> st.SearchStrategy[Any]:
    wrong = st.sampled_from([1.5, 0.0, "1", [1], {"a": 1}, True, False, 2**64, -(2**70)])
    if t == "string":
        return wrong | st.integers()
    if t == "boolean":
        return wrong | st.sampled_from([0, 1, "true"])
    half = 2 ** (INTEGER_BITS[t] - 1)
    return wrong | st.sampled_from([-half - 1, half, 2**63, -(2**63) - 1])


@st.composite
def _value(draw: st.DrawFn, schema: Struct, kinds: list[str]) -> bytes | None:
    kind = draw(st.sampled_from(kinds))
    if kind == "tombstone":
        return None
    if kind == "not_json":
        return draw(st.sampled_from([b"", b"not json", b'{"a": 1', b"\xff\xfe", b'"\\ud800"',
                                     b"NaN", b"1e400"]) | st.binary(max_size=6))
    if kind == "not_object":
        return draw(st.sampled_from([b"[]", b"[1, 2]", b"null", b"3", b'"x"', b"true"]))
    event: dict[str, Any] = {}
    for name, t in schema.fields:
        assert isinstance(t, Primitive)
        event[name] = draw(_valid(t.name))
    if kind != "valid":
        name = draw(st.sampled_from(schema.names))
        t = dict(schema.fields)[name]
        assert isinstance(t, Primitive)
        if kind == "missing":
            del event[name]
        else:
            event[name] = None if kind == "null" else draw(_invalid(t.name))
    if draw(st.booleans()):
        event[draw(st.sampled_from(["extra", "other"]))] = draw(st.integers() | st.none())
    return json.dumps(event).encode()  # json: orjson cannot write ints beyond 64 bits


_keys = st.none() | st.binary(max_size=4) | st.sampled_from([b"\xff", b"caf\xc3\xa9", b""])
_headers = st.none() | st.lists(
    st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=3)), max_size=2)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Struct, list[str], bool, list[list[Record]]]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4,
                          unique=True))
    schema = Struct(tuple((n, Primitive(draw(st.sampled_from(FLAT_TYPES)))) for n in names))
    integers = [n for n, t in schema.fields if isinstance(t, Primitive)
                and t.name in INTEGER_BITS]
    non_negative = draw(st.lists(st.sampled_from(integers), unique=True)) if integers else []
    # A few kinds per example: chunks that are all valid take the fast path.
    kinds = sorted(draw(st.sets(st.sampled_from(KINDS), min_size=1, max_size=3)))
    chunks = []
    offset = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 3))):
        chunk = [(draw(st.integers(-(2**40), 2**44)), draw(_keys), draw(_value(schema, kinds)),
                  draw(_headers)) for _ in range(draw(st.integers(0, 12)))]
        if draw(st.booleans()):
            # A long run of valid records: the few bad rows around it are cut out run by run.
            at = draw(st.integers(0, len(chunk)))
            chunk[at:at] = [(1, b"k", draw(_value(schema, ["valid"])), None)] * 64
        records = []
        for timestamp_ms, key, value, headers in chunk:
            offset += draw(st.integers(1, 3))
            records.append((offset, timestamp_ms, key, value, headers))
        chunks.append(records)
    return schema, non_negative, draw(st.booleans()), chunks


@given(_cases(), st.sampled_from([0.0, ColumnarParser.PER_RECORD_ABOVE, 0.5, 1.0]))
@settings(deadline=None, max_examples=300)
def test_columnar_matches_per_record(
    case: tuple[Struct, list[str], bool, list[list[Record]]], per_record_above: float,
) -> None:
    """Whichever way each chunk goes (column checks, or record by record after a chunk that
    was mostly dead letters), the rows and dead letters are the per-record path's."""
    schema, non_negative, pass_tombstones, chunks = case
    expected_batch, expected_dead = _per_record(
        schema, non_negative, pass_tombstones, [r for c in chunks for r in c])
    batch, dead = _columnar(schema, non_negative, pass_tombstones, chunks, per_record_above)
    assert batch.equals(expected_batch), (batch.to_pylist(), expected_batch.to_pylist())
    assert dead == expected_dead


@pytest.mark.parametrize("pass_tombstones", [True, False])
def test_after_a_mostly_dead_chunk(pass_tombstones: bool) -> None:
    """The chunk after one of mostly dead letters goes record by record, tombstones alike."""
    schema = parse_ddl("a bigint, b string")
    dead_chunk: list[Record] = [(i, 5, b"k", b'{"a": "1", "b": "x"}', None) for i in range(4)]
    mixed: list[Record] = [(4, 5, None, None, [("h", b"v")]),
                           (5, 5, b"\xff", b'{"a": 1, "b": "x"}', []),
                           (6, 5, b"k", b'{"a": true, "b": "x"}', None),
                           (7, 5, b"k", None, None)]
    chunks = [dead_chunk, mixed, mixed]
    expected = _per_record(schema, [], pass_tombstones, [r for c in chunks for r in c])
    batch, dead = _columnar(schema, [], pass_tombstones, chunks, ColumnarParser.PER_RECORD_ABOVE)
    assert batch.equals(expected[0]) and dead == expected[1]
    assert batch.num_rows == (6 if pass_tombstones else 2)


# The Kafka metadata columns ----------------------------------------------------------------

@given(st.lists(st.tuples(_keys, _headers), max_size=8))
@settings(deadline=None)
def test_metadata_columns(rows: list[tuple[bytes | None, Any]]) -> None:
    keys, headers = [k for k, _ in rows], [h for _, h in rows]
    topic, partition, offsets, timestamps, key_col, header_col = kafka_arrays(
        TOPIC, PARTITION, list(range(len(rows))), [1_700_000_000_123] * len(rows), keys,
        headers)
    assert topic.to_pylist() == [TOPIC] * len(rows)
    assert partition.type == pa.int32() and partition.to_pylist() == [PARTITION] * len(rows)
    assert offsets.to_pylist() == list(range(len(rows)))
    assert timestamps.type == pa.timestamp("us", tz="UTC")
    assert timestamps.cast(pa.int64()).to_pylist() == [1_700_000_000_123_000] * len(rows)
    assert key_col.to_pylist() == [None if k is None else k.decode("utf-8", "replace")
                                   for k in keys]
    # The struct rows pyarrow reads from Kafka's (name, value) tuples, and [] as no headers.
    as_dicts = [[{"key": k, "value": v} for k, v in h] if h else None for h in headers]
    assert header_col.equals(pa.array(as_dicts, pa.list_(_HEADER)))


# Which schemas take the path ---------------------------------------------------------------

@pytest.mark.parametrize("ddl", [
    "a bigint, s struct<b: int>", "a bigint, tags array<string>", "m map<string, int>",
    "a double", "a float", "a decimal(10,2)", "a timestamp", "a date",
])
def test_other_schemas_keep_the_per_record_path(ddl: str) -> None:
    schema = parse_ddl(ddl)
    assert ColumnarParser.for_schema(schema, EventParser(schema), [], False) is None


def test_flat_schemas_take_the_columnar_path() -> None:
    schema = parse_ddl("a bigint, b int, c smallint, d tinyint, e string, f boolean")
    assert ColumnarParser.for_schema(schema, EventParser(schema, ["b"]), ["b"], True)
    flat = from_flat({"user_id": "long", "url": "string"})
    assert ColumnarParser.for_schema(flat, EventParser(flat), [], False)


# The source's read() ------------------------------------------------------------------------

def _sample_chunks(count: int, size: int) -> list[list[Record]]:
    records: list[Record] = []
    for i, (key, value) in enumerate(sample_events(count, seed=11)):
        v: bytes | None = None if i % 997 == 0 else value  # a tombstone now and then
        headers = [("trace", str(i).encode())] if i % 13 == 0 else None
        records.append((i, 1_700_000_000_000 + i, key, v, headers))
    return [records[i:i + size] for i in range(0, count, size)]


def _read(monkeypatch: pytest.MonkeyPatch, chunks: list[list[Record]], tombstones: str,
          columnar: bool) -> tuple[list[pa.RecordBatch], list[tuple[Any, ...]], int]:
    """Batches, staged dead letters and the found count of read(), Kafka and the DB stubbed."""
    import orchestrator.kafka.reader
    import orchestrator.spark.writer

    dead: list[tuple[Any, ...]] = []
    found: list[int] = []

    def read_range(*args: Any, **kwargs: Any) -> Iterator[list[Record]]:
        assert kwargs["headers"] is True
        yield from chunks

    monkeypatch.setattr(orchestrator.kafka.reader, "read_range", read_range)
    monkeypatch.setattr(orchestrator.spark.writer, "stage_dead_letters",
                        lambda _schema, rows: dead.extend(rows))
    monkeypatch.setattr(orchestrator.spark.writer, "stage_read",
                        lambda *args, **_: found.append(args[-1]))
    if not columnar:
        monkeypatch.setattr(ColumnarParser, "for_schema", lambda *args: None)
    reader = source.KafkaStreamReader({
        "kafka": json.dumps({"bootstrap": "localhost:9092"}), "topic": TOPIC, "group_id": "g",
        "schema": "user_id bigint, url string, ts bigint, duration_ms bigint",
        "non_negative": json.dumps(["duration_ms"]), "tombstones": tombstones,
        "start_offsets": "{}", "chunk_records": "10000", "max_batch_records": "100000",
        "version_id": str(VERSION_ID), "catalog_schema": "unused", "job": "j", "version": "v1",
    })
    batches = list(reader.read(source.KafkaRange(TOPIC, PARTITION, 0, 25_000)))
    monkeypatch.undo()
    return batches, dead, found[0]


@pytest.mark.parametrize("tombstones", ["pass", "dead_letter"])
def test_read_gives_the_same_batches_both_ways(monkeypatch: pytest.MonkeyPatch,
                                               tombstones: str) -> None:
    chunks = _sample_chunks(25_000, 7_000)
    batches, dead, found = _read(monkeypatch, chunks, tombstones, columnar=True)
    expected_batches, expected_dead, expected_found = _read(monkeypatch, chunks, tombstones,
                                                            columnar=False)
    assert found == expected_found == 25_000
    assert [b.num_rows for b in batches] == [b.num_rows for b in expected_batches]
    assert len(batches) == 2
    assert all(b.equals(e) for b, e in zip(batches, expected_batches, strict=True))
    assert dead == expected_dead
    assert len(dead) > 50  # the sample's invalid events, and tombstones unless passed
