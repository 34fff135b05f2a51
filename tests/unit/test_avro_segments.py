"""Avro events through every read of a replay (#62): the stream source's read from Kafka, a raw
segment read with ``parsed_chunks``, and one decoded once then read back from Parquet give the
rows of fastavro's own decode and resolution (generated writer and reader schemas, fields
dropped and added) and the dead letters, reason for reason, of the per-record parser, with
garbled values, unknown schema ids and tombstones among them. The decoded segment records the
writer schema ids it met."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.archive.decoder import (
    decode,
    parsed_chunks,
    read_columns,
    split_decoded,
    writer_ids,
)
from orchestrator.archive.parquet_store import parquet_bytes, to_table
from orchestrator.archive_model.decoding import Decoding
from orchestrator.archive_model.segments import ArchivedRecord
from orchestrator.formats import wire
from orchestrator.formats.avro_events import AvroEventParser
from orchestrator.formats.avro_types import event_struct
from orchestrator.models import EventFormat, TopicInput
from orchestrator.spark.read.batch_builder import BatchBuilder

from .decoded_reference import PARTITION, TOPIC, canonical, schema_of
from .test_avro_events import _WRITERS, _encoded, _plain, _reader_of, _reference

_SETTINGS = settings(max_examples=40, derandomize=True, database=None, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
WRITER_ID, UNKNOWN_ID = 41, 42


class _Registry:
    """The schema registry's lookups over a dict (the client itself is tested against the
    stand-in registry in test_schema_registry.py)."""

    def __init__(self, schemas: Mapping[int, Any]):
        self.schemas, self.asked = dict(schemas), Counter[int]()

    def avro_schema(self, schema_id: int) -> Any:
        self.asked[schema_id] += 1
        return self.schemas.get(schema_id)

    def known(self, schema_id: int) -> bool:
        return schema_id in self.schemas


def _decoding(reader: dict[str, Any], tombstones: str) -> Decoding:
    fmt = EventFormat("avro", json.dumps(reader, sort_keys=True), source="inline")
    return Decoding.of(TopicInput(TOPIC, event_struct(reader).ddl(), (), tombstones, fmt))


@st.composite
def _values(draw: st.DrawFn, schema: Any, records: st.SearchStrategy[Any]) -> bytes | None:
    good = wire.frame(WRITER_ID, _encoded(schema, draw(records)))
    cut = draw(st.integers(0, len(good)))
    return draw(st.sampled_from([
        good, good, None, wire.frame(UNKNOWN_ID, good[5:]), b"{\"not\": \"avro\"}",
        good[:cut], good + b"\x01", good[:cut] + bytes([draw(st.integers(0, 255))]) +
        good[cut + 1:]]))


def _archived(values: Sequence[bytes | None]) -> list[ArchivedRecord]:
    return [(100 + 2 * i, 1_700_000_000_000 + i, 0, b"k%d" % i, v, [("h", b"v")] if i % 2 else [])
            for i, v in enumerate(values)]


def _reference_rows(records: Sequence[ArchivedRecord], decoding: Decoding, schema: Any,
                    reader: Any) -> tuple[pa.Table, list[int]]:
    """fastavro's reading: each valid value's row, and the offsets of the dead letters."""
    fields = event_struct(reader).names
    builder = BatchBuilder(schema_of(decoding), TOPIC, PARTITION, len(fields),
                           pass_tombstones=decoding.tombstones == "pass", version_id=0,
                           catalog_schema="")
    for offset, timestamp_ms, _, key, value, headers in records:
        found = None if value is None else _reference(value, {WRITER_ID: schema}, reader)
        values = None if found is None else tuple(_plain(found[n]) for n in fields)
        builder.add(offset, timestamp_ms, key, value, headers, values,
                    None if values is not None else "dead")
    return builder.flush(), [d[3] for d in builder.dead]


@_SETTINGS
@given(st.data(), _WRITERS, st.lists(st.booleans(), max_size=5), st.integers(0, 2),
       st.sampled_from(["dead_letter", "pass"]))
def test_kafka_raw_and_decoded_segments_read_as_fastavro_reads_them(
        data: st.DataObject, writer: tuple[Any, Any], dropped: list[bool], added: int,
        tombstones: str) -> None:
    schema, records = writer
    reader = _reader_of(schema, dropped, added)
    decoding = _decoding(reader, tombstones)
    archived = _archived(data.draw(st.lists(_values(schema, records), min_size=1, max_size=8)))
    expected_rows, dead_offsets = _reference_rows(archived, decoding, schema, reader)
    per_record = AvroEventParser(reader, {WRITER_ID: schema}.get)
    reasons = [(r[0], per_record.parse(r[4])[1]) for r in archived if r[0] in dead_offsets]
    registry = _Registry({WRITER_ID: schema})

    raw_rows, raw_dead = [], []
    for batch, dead in parsed_chunks(to_table(archived), decoding, TOPIC, PARTITION,
                                     registry=registry):
        raw_rows.append(batch)
        raw_dead += dead
    decoded = decode(to_table(archived), decoding, TOPIC, PARTITION, registry)
    segment = pq.read_table(pa.BufferReader(parquet_bytes(decoded)),
                            columns=read_columns(schema_of(decoding)))
    rows, dead = split_decoded(segment, TOPIC, 0, 10_000, schema_of(decoding))
    # The stream source from Kafka, with a registry of its own (the count below is the
    # archive's).
    from_kafka, kafka_dead = _read_from_kafka(archived, decoding, _Registry({WRITER_ID: schema}))
    for got_rows, got_dead in ((pa.Table.from_batches(raw_rows), raw_dead), (rows, dead),
                               (from_kafka, [d[3:] for d in kafka_dead])):
        assert canonical(got_rows.to_pylist()) == canonical(expected_rows.to_pylist())
        assert [(d[0], d[4]) for d in got_dead] == reasons
        assert all(reason for _, reason in reasons)
    # Each id (garbled ones too) looked up once per parse, the raw read's and the decode's; the
    # known ids met kept with the decoded segment.
    assert all(n <= 2 for n in registry.asked.values()), registry.asked
    met = {WRITER_ID for r in archived if r[4] and r[4][:5] == wire.frame(WRITER_ID, b"")}
    assert writer_ids(decoded) == sorted(met)
    assert writer_ids(pq.read_schema(pa.BufferReader(parquet_bytes(decoded)))) == sorted(met)


def _read_from_kafka(archived: Sequence[ArchivedRecord], decoding: Decoding, registry: _Registry
                     ) -> tuple[pa.Table, list[tuple[Any, ...]]]:
    """The stream source's read of ``archived`` from Kafka (its reader, the catalog's stage
    and the registry's client stubbed): its rows and its staged dead letters."""
    import pytest

    import orchestrator.kafka.reader
    import orchestrator.spark.writer
    from orchestrator.kafka.endpoint import KafkaEndpoint
    from orchestrator.kafka.registry_endpoint import RegistryEndpoint
    from orchestrator.spark.read import source

    dead: list[tuple[Any, ...]] = []
    options = source.source_options(
        kafka=KafkaEndpoint("localhost:9092"), source=TopicInput(
            TOPIC, decoding.schema, decoding.non_negative, decoding.tombstones, decoding.format),
        group_id="g", start_offsets={}, chunk_records=10_000, max_batch_records=10_000,
        version_id=0, catalog_schema="unused", job="j", version="v1",
        registry=RegistryEndpoint("http://registry.invalid:8081"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(orchestrator.kafka.reader, "read_range", lambda *_, **__: iter(
            [[(o, ts, key, value, headers) for o, ts, _, key, value, headers in archived]]))
        patch.setattr(orchestrator.spark.writer, "stage_dead_letters",
                      lambda _schema, rows: dead.extend(rows))
        patch.setattr(orchestrator.spark.writer, "stage_read", lambda *_, **__: None)
        patch.setattr(source, "writer_schemas", lambda endpoint: endpoint and registry)
        batches = list(source.KafkaStreamReader(options).read(source.KafkaRange(
            TOPIC, PARTITION, archived[0][0], archived[-1][0] + 1)))
    return pa.Table.from_batches(batches, schema_of(decoding)), dead


def test_a_json_decoding_keeps_its_fingerprint_and_readers_tell_avro_decodings_apart() -> None:
    plain = Decoding.of(TopicInput(TOPIC, "`url` string", (), "dead_letter"))
    assert "format" not in plain.to_json()
    assert Decoding.from_json(plain.to_json()) == plain
    one = {"type": "record", "name": "R", "fields": [{"name": "url", "type": "string"}]}
    two = {**one, "fields": [*one["fields"], {"name": "n", "type": "long", "default": 0}]}
    first, second = _decoding(one, "dead_letter"), _decoding(two, "dead_letter")
    assert len({plain.fingerprint, first.fingerprint, second.fingerprint}) == 3
    assert Decoding.from_json(json.loads(json.dumps(first.to_json()))) == first
    # Same fields, same rules, another reader (a default changed): another decoding.
    three = {**two, "fields": [*one["fields"], {"name": "n", "type": "long", "default": 1}]}
    assert _decoding(three, "dead_letter").schema == second.schema
    assert _decoding(three, "dead_letter").fingerprint != second.fingerprint
