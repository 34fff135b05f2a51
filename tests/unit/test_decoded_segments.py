"""Decoded segments against the per-record parser: a raw segment decoded once, written as a
Parquet file and read back through ``split_decoded`` gives the rows and the dead letters,
reason for reason, that ``EventParser.parse`` fed record by record into ``BatchBuilder`` gives,
for valid events and every kind of invalid one, over any range of offsets."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.archive import decoder as decoder_module
from orchestrator.archive.decoder import decode, decoded_schema, read_columns, split_decoded
from orchestrator.archive.parquet_store import parquet_bytes, to_table
from orchestrator.archive_model.decoding import Decoding
from orchestrator.archive_model.segments import ArchivedRecord
from orchestrator.models import TopicInput
from orchestrator.schema import parse_ddl

from .decoded_reference import (
    PARTITION,
    TOPIC,
    canonical,
    decoding_of,
    per_record,
    schema_of,
)
from .event_strategies import (
    _BOUNDS,
    _DEPTH,
    _INSERTS,
    _NOT_OBJECTS,
    _TOKENS,
    EVERYTHING,
    FLAT,
    NARROW,
    NEAR_RESERVED,
    NESTED,
    _segments,
)

TOMBSTONES = st.sampled_from(["dead_letter", "pass"])


# --- the two paths --------------------------------------------------------------------------


def _decoded_segment(records: Sequence[ArchivedRecord], decoding: Decoding) -> pa.Table:
    """Decoded once, written as a Parquet file and read back, as the read tasks read it."""
    table = decode(to_table(records), decoding, TOPIC, PARTITION)
    assert table.schema == decoded_schema(decoding)
    assert table.column("kafka_offset").to_pylist() == [r[0] for r in records]  # one row each
    return pq.read_table(pa.BufferReader(parquet_bytes(table)),
                         columns=read_columns(schema_of(decoding)))


def _same(records: Sequence[ArchivedRecord], decoding: Decoding,
          ranges: Sequence[tuple[int, int]] = (EVERYTHING,)
          ) -> tuple[pa.Table, list[tuple[Any, ...]]]:
    """Each range [start, end) of the decoded segment of ``records`` against the per-record
    parser's reading of the records in that range alone; the last range's result."""
    segment = _decoded_segment(records, decoding)
    schema = schema_of(decoding)
    for start, end in ranges:
        rows, dead = split_decoded(segment, TOPIC, start, end, schema)
        kept = [r for r in records if start <= r[0] < end]
        expected_rows, expected_dead = per_record(kept, decoding)
        assert rows.schema == expected_rows.schema == schema
        assert canonical(rows.to_pylist()) == canonical(expected_rows.to_pylist())
        assert dead == expected_dead
        assert rows.num_rows + len(dead) == len(kept)
        assert rows.column("kafka_topic").to_pylist() == [TOPIC] * rows.num_rows
    return rows, dead


def _records(values: Sequence[bytes | None], first: int = 100) -> list[ArchivedRecord]:
    keys: list[bytes | None] = [b"k", None, b"\xffbad", b"\xc3\xa9", b""]
    headers: list[Any] = [None, [], [("h", b"v")], [("h", None)], [("\u00e9", b""), ("g", b"\xff")]]
    return [(first + 3 * i, 1_700_000_000_000 + i, i % 2, keys[i % 5], v, headers[i // 2 % 5])
            for i, v in enumerate(values)]


def _check(segment: tuple[list[ArchivedRecord], int, int, int], decoding: Decoding) -> None:
    records, start, end, chunk = segment
    # A small chunk size puts chunk boundaries between a few records, as 20,000 of them would.
    with mock.patch.object(decoder_module, "ROWS_PER_ARROW_BATCH", chunk):
        _same(records, decoding, [EVERYTHING, (start, end)])


# --- property tests, one per kind of schema -------------------------------------------------

# Fewer examples than the record-by-record parser's own properties (test_arrow_events.py), which
# already cover the values: these cover the segment's cuts, chunks and rules around them.
_SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(_segments(FLAT), st.sampled_from([("duration_ms",), ("duration_ms", "user_id")]),
       TOMBSTONES)
def test_property_flat_events_read_through_decoded_segments_as_parsed_record_by_record(
        segment: tuple[list[ArchivedRecord], int, int, int], non_negative: tuple[str, ...],
        tombstones: str) -> None:
    _check(segment, decoding_of(FLAT, non_negative, tombstones))


@_SETTINGS
@given(_segments(NARROW), st.sampled_from([(), ("n",), ("tiny", "n")]), TOMBSTONES)
def test_property_narrow_integers_and_booleans_read_through_decoded_segments_the_same(
        segment: tuple[list[ArchivedRecord], int, int, int], non_negative: tuple[str, ...],
        tombstones: str) -> None:
    _check(segment, decoding_of(NARROW, non_negative, tombstones))


@settings(_SETTINGS, max_examples=40)
@given(_segments(NESTED),
       st.sampled_from([(), ("loc.lat",), ("amount", "id", "loc.lon", "price")]), TOMBSTONES)
def test_property_nested_and_other_types_read_through_decoded_segments_the_same(
        segment: tuple[list[ArchivedRecord], int, int, int], non_negative: tuple[str, ...],
        tombstones: str) -> None:
    _check(segment, decoding_of(NESTED, non_negative, tombstones))


@settings(_SETTINGS, max_examples=40)
@given(_segments(NEAR_RESERVED), st.sampled_from([(), ("dead",), ("amount", "dead_reason")]),
       TOMBSTONES)
def test_property_fields_named_like_the_added_columns_read_through_decoded_segments_the_same(
        segment: tuple[list[ArchivedRecord], int, int, int], non_negative: tuple[str, ...],
        tombstones: str) -> None:
    """Fields named like a decoded segment's dead-letter columns or the Kafka metadata (#60),
    and undeclared JSON fields named as they are, among every kind of value."""
    _check(segment, decoding_of(NEAR_RESERVED, non_negative, tombstones))


# --- every kind of invalid event, each one for certain ---------------------------------------

_GOOD = {
    FLAT: b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7}',
    NARROW: b'{"n":1,"flag":true,"s":"x","tiny":-3}',
    NESTED: b'{"id":1,"price":2.5,"tags":["a"],"attrs":{"k":3},"loc":{"lat":1.5,"lon":-2.0},'
            b'"day":"2024-02-29","at":"2024-01-02T03:04:05.5+01:00","amount":"12.34"}',
}
_NON_NEGATIVE = {FLAT: ("duration_ms",), NARROW: ("n",), NESTED: ("loc.lat", "amount")}


def _tricky(ddl: str) -> list[bytes | None]:
    """The good event with each field, in turn, replaced by each token and by values at the
    bounds; with an extra field of each token; duplicated, reordered, re-spaced; and values
    that are not JSON objects, or not JSON, or not UTF-8."""
    good = _GOOD[ddl]
    event = json.loads(good)
    out: list[bytes | None] = [None, b"", *_NOT_OBJECTS, good, b" " + good, good + b"\n",
                               good.replace(b",", b",\n"), good.replace(b":", b" : ")]
    others = list(dict.fromkeys([*_TOKENS, *(str(b).encode() for b in _BOUNDS[:-1]), b"null",
                                 b"true", b'"1"', b"1.5", b"-1"]))
    for name in event:
        head = json.dumps({k: v for k, v in event.items() if k != name},
                          separators=(",", ":")).encode()[:-1]
        out.append(head + b"}")  # missing
        for token in others:
            out.append(head + b',"' + name.encode() + b'":' + token + b"}")
        out.append(b'{"' + name.encode() + b'":[0],' + good[1:])  # the first of two
        out.append(good[:-1] + b',"' + name.encode() + b'":null}')  # the last null wins
        out.append(b'{"\\u%04x' % ord(name[0]) + name[1:].encode() + b'":[],' + good[1:])
    out += [good[:-1] + b',"x":' + token + b"}" for token in _TOKENS]
    out += [good[:-1] + b',"x":' + b"[" * _DEPTH + b"]" * _DEPTH + b"}"]
    out += [good[:at] + insert + good[at:] for insert in _INSERTS
            for at in (1, len(good) // 2, len(good) - 1)]
    out += [good[:at] for at in range(0, len(good), 7)]
    return out


@pytest.mark.parametrize("ddl", [FLAT, NARROW, NESTED], ids=["flat", "narrow", "nested"])
def test_every_kind_of_invalid_event_reads_through_decoded_segments_as_record_by_record(
        ddl: str) -> None:
    values = _tricky(ddl)
    good = _GOOD[ddl]
    if ddl != NESTED:  # the Arrow path: one at a time, so that no value hides another's outcome
        decoding = decoding_of(ddl, _NON_NEGATIVE[ddl])
        for value in values:
            _same(_records([good, value, good]), decoding)
    for tombstones in ("dead_letter", "pass"):
        decoding = decoding_of(ddl, _NON_NEGATIVE[ddl], tombstones)
        rows, dead = _same(_records(values), decoding)
        assert len(dead) > len(values) // 2  # most of them are invalid, for every reason
        first = next(iter(json.loads(good)))
        assert {reason.split(":")[0] for *_, reason in dead} >= {"not JSON",
                                                                 f"missing field {first}"}
        assert rows.num_rows > 10  # and several are kept


@pytest.mark.parametrize("ddl", [FLAT, NARROW, NESTED], ids=["flat", "narrow", "nested"])
def test_every_range_of_a_segment_reads_as_those_records_parsed_alone(ddl: str) -> None:
    values = [_GOOD[ddl], None, b"{", _GOOD[ddl], b"[1]", _GOOD[ddl], b"{}"]
    records = _records(values, first=50)  # offsets 50, 53, ..., 68
    decoding = decoding_of(ddl, _NON_NEGATIVE[ddl], "pass")
    _same(records, decoding, [(start, end) for start in range(48, 71) for end in range(start, 71)])


# Found by this file: a value nested deeper than orjson reads (more than 1,024 levels in all)
# inside a field that the schema does not declare. The per-record parser's orjson refuses it
# ("not JSON: depth limit exceeded"); the Arrow fast path that `decode` takes for flat schemas
# kept it as a row (pyarrow's JSON reader skips the undeclared field), until values with as
# many brackets as that depth were sent to the per-record parser. (The property tests stay at
# orjson's limit, _DEPTH, which both paths read.)
@pytest.mark.parametrize("ddl", [FLAT, NARROW], ids=["flat", "narrow"])
def test_json_deeper_than_orjson_reads_is_a_dead_letter_in_a_decoded_segment(ddl: str) -> None:
    too_deep = _GOOD[ddl][:-1] + b',"x":' + b"[" * (_DEPTH + 1) + b"]" * (_DEPTH + 1) + b"}"
    _same(_records([too_deep]), decoding_of(ddl, _NON_NEGATIVE[ddl]))


def test_json_deeper_than_orjson_reads_is_a_dead_letter_in_a_nested_schemas_segment() -> None:
    too_deep = _GOOD[NESTED][:-1] + b',"x":' + b"[" * (_DEPTH + 1) + b"]" * (_DEPTH + 1) + b"}"
    _, dead = _same(_records([too_deep]), decoding_of(NESTED))
    assert [reason.split(":")[0] for *_, reason in dead] == ["not JSON"]


# --- plain tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("ddl", [FLAT, NARROW, NESTED], ids=["flat", "narrow", "nested"])
def test_decoding_an_empty_segment_gives_an_empty_table(ddl: str) -> None:
    decoding = decoding_of(ddl)
    table = decode(to_table([]), decoding, TOPIC, PARTITION)
    assert table.num_rows == 0
    assert table.schema == decoded_schema(decoding)
    rows, dead = _same([], decoding)
    assert rows.num_rows == 0 and dead == []


def test_fingerprints_differ_with_what_decides_a_row_and_agree_otherwise() -> None:
    base = TopicInput("page_views", parse_ddl(FLAT).ddl(), ("duration_ms", "ts"), "dead_letter")
    variants = [
        base,
        TopicInput("page_views", parse_ddl(FLAT.replace("url string", "url string, x int"))
                   .ddl(), base.non_negative, "dead_letter"),
        TopicInput("page_views", parse_ddl(FLAT.replace("ts bigint", "ts int")).ddl(),
                   base.non_negative, "dead_letter"),
        TopicInput("page_views", base.schema, ("duration_ms",), "dead_letter"),
        TopicInput("page_views", base.schema, (), "dead_letter"),
        TopicInput("page_views", base.schema, ("duration_ms", "ts", "user_id"), "dead_letter"),
        TopicInput("page_views", base.schema, base.non_negative, "pass"),
    ]
    prints = [Decoding.of(v).fingerprint for v in variants]
    assert len(set(prints)) == len(prints)
    assert all(len(p) == 16 and int(p, 16) >= 0 for p in prints)
    same = [TopicInput("page_views", base.schema, ("ts", "duration_ms"), "dead_letter"),
            TopicInput("other_topic", base.schema, ("ts", "duration_ms"), "dead_letter"), base]
    assert {Decoding.of(v).fingerprint for v in same} == {prints[0]}
    assert Decoding.of(same[0]) == Decoding.of(base)
    decoding = Decoding.of(base)
    assert Decoding.from_json(json.loads(json.dumps(decoding.to_json()))) == decoding
    assert Decoding.from_json(decoding.to_json()).fingerprint == decoding.fingerprint
