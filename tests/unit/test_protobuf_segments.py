"""Protobuf events through every read of a replay (#62): the stream source's read from Kafka, a
raw segment read with ``parsed_chunks``, and a segment decoded once then read back from Parquet
give the rows of Protobuf's own decode (generated descriptors and messages) and the dead
letters, reason for reason, of the per-record parser, with garbled values, unknown schema ids,
values not in the wire format and tombstones among them."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.archive.decoder import decode, parsed_chunks, read_columns, split_decoded
from orchestrator.archive.parquet_store import parquet_bytes, to_table
from orchestrator.archive_model.decoding import Decoding
from orchestrator.archive_model.segments import ArchivedRecord
from orchestrator.formats import wire
from orchestrator.formats.protobuf_events import ProtobufEventParser
from orchestrator.formats.protobuf_types import event_struct, message_descriptor
from orchestrator.models import EventFormat, TopicInput
from orchestrator.spark.read.batch_builder import BatchBuilder

from .decoded_reference import PARTITION, TOPIC, canonical, schema_of
from .test_avro_segments import _archived, _read_from_kafka, _Registry
from .test_protobuf_events import _filled, _messages, _reference

_SETTINGS = settings(max_examples=30, derandomize=True, database=None, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
WRITER_ID, UNKNOWN_ID = 7, 8
MESSAGE = "kappa.E"


def _decoding(descriptors: bytes, tombstones: str) -> Decoding:
    fmt = EventFormat("protobuf", base64.b64encode(descriptors).decode(), MESSAGE,
                      source="events.desc")
    struct = event_struct(message_descriptor(descriptors, MESSAGE, "-"), "-")
    return Decoding.of(TopicInput(TOPIC, struct.ddl(), (), tombstones, fmt))


@st.composite
def _values(draw: st.DrawFn, cls: Any, plan: list[tuple[str, str, Any]]) -> bytes | None:
    body = _filled(cls, plan, [draw(values) for _, _, values in plan]).SerializeToString()
    good = wire.frame(WRITER_ID, body, draw(st.sampled_from([(0,), (1,), (0, 2)])))
    cut = draw(st.integers(0, len(good)))
    return draw(st.sampled_from([
        good, good, None, wire.frame(UNKNOWN_ID, body, (0,)), b"{\"not\": \"protobuf\"}",
        good[:cut], good[:cut] + bytes([draw(st.integers(0, 255))]) + good[cut + 1:]]))


def _reference_rows(records: Sequence[ArchivedRecord], decoding: Decoding, cls: Any,
                    parser: ProtobufEventParser) -> tuple[pa.Table, list[int]]:
    """Protobuf's own decode: each valid value's row, and the offsets of the dead letters."""
    builder = BatchBuilder(schema_of(decoding), TOPIC, PARTITION, len(parser.fields),
                           pass_tombstones=decoding.tombstones == "pass", version_id=0,
                           catalog_schema="")
    for offset, timestamp_ms, _, key, value, headers in records:
        values = None
        framed = None if value is None else wire.read_frame(value, indexed=True)
        if isinstance(framed, tuple) and framed[0] == WRITER_ID:
            values = _reference(cls, framed[1], parser)
        builder.add(offset, timestamp_ms, key, value, headers, values,
                    None if values is not None else "dead")
    return builder.flush(), [d[3] for d in builder.dead]


@_SETTINGS
@given(st.data(), _messages(), st.sampled_from(["dead_letter", "pass"]))
def test_every_read_of_protobuf_records_reads_as_protobufs_own_decode(
        data: st.DataObject, generated: tuple[bytes, list[tuple[str, str, Any]]],
        tombstones: str) -> None:
    descriptors, plan = generated
    cls = message_factory.GetMessageClass(message_descriptor(descriptors, MESSAGE, "-"))
    decoding = _decoding(descriptors, tombstones)
    archived = _archived(data.draw(st.lists(_values(cls, plan), min_size=1, max_size=6)))
    per_record = ProtobufEventParser(descriptors, MESSAGE, {WRITER_ID: True}.get)
    expected_rows, dead_offsets = _reference_rows(archived, decoding, cls, per_record)
    reasons = [(r[0], per_record.parse(r[4])[1]) for r in archived if r[0] in dead_offsets]
    registry = _Registry({WRITER_ID: "a Protobuf schema"})

    raw_rows, raw_dead = [], []
    for batch, dead in parsed_chunks(to_table(archived), decoding, TOPIC, PARTITION,
                                     registry=registry):
        raw_rows.append(batch)
        raw_dead += dead
    decoded = decode(to_table(archived), decoding, TOPIC, PARTITION, registry)
    segment = pq.read_table(pa.BufferReader(parquet_bytes(decoded)),
                            columns=read_columns(schema_of(decoding)))
    rows, dead = split_decoded(segment, TOPIC, 0, 10_000, schema_of(decoding))
    from_kafka, kafka_dead = _read_from_kafka(archived, decoding, registry)
    for got_rows, got_dead in ((pa.Table.from_batches(raw_rows), raw_dead), (rows, dead),
                               (from_kafka, [d[3:] for d in kafka_dead])):
        assert canonical(got_rows.to_pylist()) == canonical(expected_rows.to_pylist())
        assert [(d[0], d[4]) for d in got_dead] == reasons
        assert all(reason for _, reason in reasons)
