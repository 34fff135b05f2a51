"""Decoded segments against the per-record parser: a raw segment decoded once, written as a
Parquet file and read back through ``split_decoded`` gives the rows and the dead letters,
reason for reason, that ``EventParser.parse`` fed record by record into ``BatchBuilder`` gives,
for valid events and every kind of invalid one, over any range of offsets."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from functools import cache
from itertools import product
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.archive import decoder as decoder_module
from orchestrator.archive.decoder import (
    decode,
    decoded_schema,
    read_columns,
    rows_schema,
    split_decoded,
)
from orchestrator.archive.parquet_store import parquet_bytes, to_table
from orchestrator.archive_model.decoding import Decoding
from orchestrator.archive_model.segments import ArchivedRecord
from orchestrator.models import TopicInput
from orchestrator.parsing import EventParser
from orchestrator.schema import parse_ddl
from orchestrator.spark.read.batch_builder import ROWS_PER_ARROW_BATCH, BatchBuilder

FLAT = "user_id bigint, url string, ts bigint, duration_ms bigint"  # the Arrow fast path
NARROW = "n int, flag boolean, s string, tiny tinyint"  # also the Arrow path
NESTED = ("id bigint, price double, tags array<string>, attrs map<string,bigint>, "
          "loc struct<lat: double, lon: double>, day date, at timestamp, amount decimal(10,2)")
TOPIC, PARTITION = "t", 3
EVERYTHING = (-(2**63), 2**63 - 1)  # a range holding every offset
TOMBSTONES = st.sampled_from(["dead_letter", "pass"])


# --- the two paths --------------------------------------------------------------------------


def _decoding(ddl: str, non_negative: Sequence[str] = (), tombstones: str = "dead_letter"
              ) -> Decoding:
    return Decoding.of(TopicInput(TOPIC, parse_ddl(ddl).ddl(), tuple(non_negative), tombstones))


@cache
def _schema(decoding: Decoding) -> pa.Schema:
    return rows_schema(decoding)


@cache
def _parser(decoding: Decoding) -> EventParser:
    return EventParser(parse_ddl(decoding.schema), decoding.non_negative)


def _per_record(records: Sequence[ArchivedRecord], decoding: Decoding
                ) -> tuple[pa.Table, list[tuple[Any, ...]]]:
    """The reference: each value parsed on its own, the rows and dead letters a read task of
    the Kafka path builds from them."""
    schema, parser = _schema(decoding), _parser(decoding)
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


def _decoded_segment(records: Sequence[ArchivedRecord], decoding: Decoding) -> pa.Table:
    """Decoded once, written as a Parquet file and read back, as the read tasks read it."""
    table = decode(to_table(records), decoding, TOPIC, PARTITION)
    assert table.schema == decoded_schema(decoding)
    assert table.column("kafka_offset").to_pylist() == [r[0] for r in records]  # one row each
    return pq.read_table(pa.BufferReader(parquet_bytes(table)),
                         columns=read_columns(_schema(decoding)))


def _canonical(value: Any) -> Any:
    """``value`` with every float made comparable bit for bit: NaN equals NaN, and -0.0 is not
    0.0."""
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(map(_canonical, value))
    return value


def _same(records: Sequence[ArchivedRecord], decoding: Decoding,
          ranges: Sequence[tuple[int, int]] = (EVERYTHING,)
          ) -> tuple[pa.Table, list[tuple[Any, ...]]]:
    """Each range [start, end) of the decoded segment of ``records`` against the per-record
    parser's reading of the records in that range alone; the last range's result."""
    segment = _decoded_segment(records, decoding)
    schema = _schema(decoding)
    for start, end in ranges:
        rows, dead = split_decoded(segment, TOPIC, start, end, schema)
        kept = [r for r in records if start <= r[0] < end]
        expected_rows, expected_dead = _per_record(kept, decoding)
        assert rows.schema == expected_rows.schema == schema
        assert _canonical(rows.to_pylist()) == _canonical(expected_rows.to_pylist())
        assert dead == expected_dead
        assert rows.num_rows + len(dead) == len(kept)
        assert rows.column("kafka_topic").to_pylist() == [TOPIC] * rows.num_rows
    return rows, dead


def _records(values: Sequence[bytes | None], first: int = 100) -> list[ArchivedRecord]:
    keys: list[bytes | None] = [b"k", None, b"\xffbad", b"\xc3\xa9", b""]
    headers: list[Any] = [None, [], [("h", b"v")], [("h", None)], [("\u00e9", b""), ("g", b"\xff")]]
    return [(first + 3 * i, 1_700_000_000_000 + i, i % 2, keys[i % 5], v, headers[i // 2 % 5])
            for i, v in enumerate(values)]


# --- values: valid events and every kind of invalid one -------------------------------------


class _Raw(bytes):
    """JSON text written as it is, not through json.dumps: what json.dumps would never write."""


_BOUNDS = [2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 2**64 - 1, 2**31 - 1, 2**31,
           -(2**31), -(2**31) - 1, 127, 128, -128, -129, 0, -1, 10**400]
_STRINGS = ["", "/a", "\u00e9", "\u0000", "\u2028", "\U0001f600", "NaN", "Infinity", "1e5",
            '"user_id":"x"', " \n", "\\"]
_TEXT = st.one_of(st.text(max_size=6), st.sampled_from(_STRINGS))
# Surrogates: json.dumps writes them as escapes ("\ud800"), or as their bytes (not UTF-8); a
# pair, escaped, is the one character it encodes.
_BAD_TEXT = st.sampled_from(["\ud800", "\udc00", "a\ud83d", "\ude00\ud83d", "\ud83d\ude00"])
_LONG = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([*_BOUNDS[:2], 0, -1]))
_DOUBLE = st.one_of(st.floats(allow_nan=False, allow_infinity=False), _LONG)
_DEPTH = 1023  # an object holding this many nested arrays is as deep as orjson reads
_TOKENS = [b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1e5", b"2E-3",
           b"1.0", b"-0", b"-0.0", b"9" * 20, b"9" * 400, b"1" + b"0" * 310 + b".5", b"01",
           b"tru", b"nul", b"[1,]", b"{}", b"[]", b'"\\ud800"', b'"\\udc00"',
           b'"\\ude00\\ud83d"', b'"\\ud83d\\ude00"', b'"\xff"', b'"\xed\xa0\x80"',
           b'"\xc3\xa9"', b'"\xf4\x90\x80\x80"', b'"a\tb"', b'"\\u0000"', b'"\\x"', b"/*c*/1",
           b'{"a":{"b":[1,{"c":null}]}}', b'{"user_id":"x","n":1.5}', b"[" * _DEPTH +
           b"]" * _DEPTH, b'"2024-02-30"', b'"2024-01-02T03:04:05Z"', b'"1.005"', b'"12.34"']
_RAW = st.sampled_from(_TOKENS).map(_Raw)
# The tokens that orjson refuses and pyarrow's reader may read, in an undeclared field
_REFUSED = st.sampled_from([b"NaN", b"-Infinity", b"1e400", b"9" * 400, b"1" + b"0" * 310 + b".5",
                            b'"\\ud800"', b'"\\udc00"', b'"\xed\xa0\x80"']).map(_Raw)
# Any JSON value ...
_JSON = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False, allow_infinity=False), _TEXT,
    st.booleans(), st.none(), st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["a", "lat", "url", "n"]), st.integers(-2, 2), max_size=2))
# ... or anything that looks like one: out of 64 bits, NaN and infinities (json.dumps writes
# their literals), surrogates, tokens that only some parsers read.
_ANY = st.one_of(_JSON, st.sampled_from(_BOUNDS), st.integers(-(2**64), 2**64), st.floats(),
                 _BAD_TEXT, _RAW)
_NOT_OBJECTS = [b"null", b"[1]", b"5", b'"s"', b"true", b"[]", b"{}", b" {}", b"{ }", b"{",
                b"}", b"\xff", b"\xef\xbb\xbf{}", b"[{}]", b'{"a":1}{"a":2}', b"{} x"]
_INSERTS = [b"NaN", b"\n", b"\r", b"\t", b"}", b"{", b"\xff", b"\xed\xa0\x80", b" ", b"1e5",
            b'"', b",", b"\\", b"\x00", b"\\ud800"]


def _timestamps() -> st.SearchStrategy[str]:
    zones: st.SearchStrategy[Any] = st.sampled_from([
        None, UTC, timezone(timedelta(hours=5, minutes=30)),
        timezone(-timedelta(hours=23, minutes=59))])
    written = st.builds(lambda t, sep: t.isoformat(sep=sep),
                        st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                                     timezones=zones), st.sampled_from(["T", " "]))
    return st.one_of(written, st.sampled_from([
        "2024-01-02T03:04:05Z", "2024-01-02t03:04z", "2024-01-02 03:04:05.123456789+0100",
        "2024-01-02T03:04", "2024-01-02T03:04:05-0530"]))


_CENTS = st.decimals(min_value=-(10**8), max_value=10**8, places=2, allow_nan=False,
                     allow_infinity=False)
# Per field: values of its type (mostly valid), and values that are wrong only for it.
_VALID: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    FLAT: {"user_id": _LONG, "url": _TEXT, "ts": _LONG,
           "duration_ms": st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([0, 2**63 - 1]))},
    NARROW: {"n": st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), 0])),
             "flag": st.booleans(), "s": _TEXT, "tiny": st.integers(-128, 127)},
    NESTED: {
        "id": _LONG, "price": _DOUBLE, "tags": st.lists(_TEXT, max_size=3),
        "attrs": st.dictionaries(_TEXT, _LONG, max_size=3),
        "loc": st.fixed_dictionaries({"lat": _DOUBLE, "lon": _DOUBLE}, optional={"alt": _JSON}),
        "day": st.dates(min_value=date(1, 1, 1)).map(date.isoformat), "at": _timestamps(),
        "amount": st.one_of(_CENTS.map(lambda d: _Raw(str(d).encode())), _CENTS.map(str),
                            st.integers(-(10**8), 10**8),
                            st.sampled_from([_Raw(b"1.50"), _Raw(b"1e3"), "1E+2", 1.5, -0.0]))},
}
_WRONG: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    FLAT: {"user_id": st.sampled_from([*_BOUNDS[2:6], True, 1.0]), "url": st.integers(0, 1),
           "ts": st.just(False), "duration_ms": st.sampled_from([-1, -(2**63), 2**63, 0.5])},
    NARROW: {"n": st.sampled_from([2**31, -(2**31) - 1, 2**63 - 1, -1, True]),
             "flag": st.sampled_from([0, 1, "true", None]), "s": st.sampled_from([[], {}, 1]),
             "tiny": st.sampled_from([128, -129, 255, -1, 1.0])},
    NESTED: {
        "id": st.sampled_from([*_BOUNDS[2:6], 1.5, "1"]), "price": st.sampled_from(["1.5", True]),
        "tags": st.sampled_from([["a", 1], "a", [None], [["a"]]]),
        "attrs": st.sampled_from([{"k": 1.5}, {"k": None}, {"k": 2**63}, ["k", 1], {"k": "1"}]),
        "loc": st.one_of(st.fixed_dictionaries({"lat": _ANY}, optional={"lon": _ANY}),
                         st.sampled_from([[1.0, 2.0], {"lat": -1.0, "lon": 0}, "1,2"])),
        "day": st.sampled_from(["2024-02-30", "2024-1-1", "20240101", "2024-01-02T", "0000-01-01",
                                "2024-01-02 ", 20240102]),
        "at": st.sampled_from(["2024-01-02T25:00:00Z", "yesterday", "2024-01-02",
                               "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
                               "2024-01-02T03:04:05.1234567890Z", 1_700_000_000]),
        "amount": st.sampled_from([_Raw(b"1.005"), "1.005", "abc", "", " 1", "12345678.99",
                                   "123456789.00", _Raw(b"123456789"), _Raw(b"-0.001"), "NaN",
                                   "1e400", 1.0e20, True])},
}


def _json_text(value: Any, ensure_ascii: bool) -> bytes:
    if isinstance(value, _Raw):
        return bytes(value)
    if isinstance(value, dict):
        return b"{" + b",".join(_json_text(k, ensure_ascii) + b":" + _json_text(v, ensure_ascii)
                                for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(_json_text(v, ensure_ascii) for v in value) + b"]"
    # A lone surrogate, with ensure_ascii=False, is written as its bytes: not UTF-8.
    return json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


def _key_text(name: str, escaped: bool, ensure_ascii: bool) -> bytes:
    if escaped and name:  # "\u0075rl": only once unescaped is it the field's name
        return b'"\\u%04x' % ord(name[0]) + _json_text(name[1:], ensure_ascii)[1:]
    return _json_text(name, ensure_ascii)


_MANGLES = st.sampled_from(["none"] * 15 + ["tombstone", "empty", "not an object", "insert",
                                             "cut"])
# About one event in 3 has a field missing, wrong for its type, of any value, or a token.
_KINDS = {ddl: st.sampled_from(["valid"] * (10 * len(fields) - 4) +
                               ["missing", "wrong", "any", "token"])
          for ddl, fields in _VALID.items()}
_OTHERS = {ddl: {name: st.one_of(valid, _WRONG[ddl][name], _ANY)
                 for name, valid in fields.items()} for ddl, fields in _VALID.items()}
_FIELD_NAMES = {ddl: st.sampled_from(list(fields)) for ddl, fields in _VALID.items()}
_EXTRA_NAMES = st.sampled_from(["extra", "x", "URL", "\u00e9", "", "id "])
_EXTRA_VALUES = st.one_of(_JSON, _REFUSED, _RAW)
_EXTRAS = st.sampled_from([0, 1, 1, 2])
# (between fields, between key and value, before the event, after it): half of the events are
# compact, for a line break sends an event off the Arrow path.
_STYLES = st.one_of(st.just((b",", b":", b"", b"")), st.sampled_from(list(product(
    [b",", b",", b", ", b",\n", b"\t,"], [b":", b":", b": ", b" :\n"],
    [b"", b"", b"", b" ", b"\n", b"\r\n"], [b"", b"", b"", b" ", b"\n", b"\t"]))))


@st.composite
def _values(draw: st.DrawFn, ddl: str) -> bytes | None:
    """An event of ``ddl``: each field valid, missing, wrong for its type, or any value or a
    token that only some parsers read; extra fields and duplicate keys; a key escaped; spaces
    and line breaks; then maybe mangled as bytes."""
    ensure_ascii = draw(st.booleans())
    kinds = {"valid": _VALID[ddl], "wrong": _WRONG[ddl], "token": dict.fromkeys(_VALID[ddl], _RAW)}
    pairs: list[tuple[str, Any]] = []
    for name in _VALID[ddl]:
        kind = draw(_KINDS[ddl])
        if kind != "missing":
            pairs.append((name, draw(kinds.get(kind, {}).get(name, _ANY))))
    for _ in range(draw(_EXTRAS)):
        pairs.append((draw(_EXTRA_NAMES), draw(_EXTRA_VALUES)))
    if draw(st.integers(0, 5)) == 5:  # a duplicate key: the last one is the value
        name = draw(_FIELD_NAMES[ddl])
        pairs.insert(draw(st.integers(0, len(pairs))), (name, draw(_OTHERS[ddl][name])))
    if draw(st.booleans()):
        pairs = draw(st.permutations(pairs))
    escaped = draw(st.integers(0, 4 * len(pairs)))  # this pair's key, if there is one
    comma, colon, before, after = draw(_STYLES)
    raw = before + b"{" + comma.join(
        _key_text(name, i == escaped, ensure_ascii) + colon + _json_text(value, ensure_ascii)
        for i, (name, value) in enumerate(pairs)) + b"}" + after
    mangle = draw(_MANGLES)
    if mangle == "tombstone":
        return None
    if mangle == "empty":
        return b""
    if mangle == "not an object":
        return draw(st.sampled_from(_NOT_OBJECTS))
    if mangle == "insert":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from(_INSERTS)) + raw[at:]
    if mangle == "cut":
        return raw[:draw(st.integers(0, len(raw)))]
    return raw


_KEYS = st.one_of(st.none(), st.sampled_from([b"k", b"", b"user-1", b"\xffbad", b"\xc3\xa9",
                                              b"\xed\xa0\x80"]), st.binary(max_size=4))
_HEADER_LISTS: list[list[tuple[str, bytes | None]] | None] = [
    None, [], [("h", b"v")], [("h", None)], [("\u00e9", b""), ("h", b"\xff"), ("h", None)]]
_HEADERS = st.sampled_from(_HEADER_LISTS)
_STAMPS = st.one_of(st.sampled_from([-1, 0, 1_700_000_000_000]),
                    st.integers(-(2**40), 253_402_300_799_999))  # up to the year 9999


@st.composite
def _segments(draw: st.DrawFn, ddl: str) -> tuple[list[ArchivedRecord], int, int, int]:
    """Records at strictly increasing offsets with gaps, a range [start, end) to read of them
    (all of it, or bounds at, before or after any offset), and a chunk size for the decoder."""
    offset = draw(st.one_of(st.integers(0, 2**62), st.just(0)))
    records: list[ArchivedRecord] = []
    for _ in range(draw(st.integers(0, 12))):
        records.append((offset, draw(_STAMPS), draw(st.integers(0, 1)), draw(_KEYS),
                        draw(_values(ddl)), draw(_HEADERS)))
        offset += draw(st.one_of(st.just(1), st.integers(1, 9), st.integers(1, 2**20)))
    start, end = EVERYTHING
    whole = draw(st.integers(0, 2)) == 0
    if records and not whole:
        points = [*EVERYTHING, *(r[0] + d for r in records for d in (-1, 0, 1))]
        start, end = sorted((draw(st.sampled_from(points)), draw(st.sampled_from(points))))
    chunk = draw(st.sampled_from([ROWS_PER_ARROW_BATCH] * 3 + [1, 3]))
    return records, start, end, chunk


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
    _check(segment, _decoding(FLAT, non_negative, tombstones))


@_SETTINGS
@given(_segments(NARROW), st.sampled_from([(), ("n",), ("tiny", "n")]), TOMBSTONES)
def test_property_narrow_integers_and_booleans_read_through_decoded_segments_the_same(
        segment: tuple[list[ArchivedRecord], int, int, int], non_negative: tuple[str, ...],
        tombstones: str) -> None:
    _check(segment, _decoding(NARROW, non_negative, tombstones))


@settings(_SETTINGS, max_examples=40)
@given(_segments(NESTED),
       st.sampled_from([(), ("loc.lat",), ("amount", "id", "loc.lon", "price")]), TOMBSTONES)
def test_property_nested_and_other_types_read_through_decoded_segments_the_same(
        segment: tuple[list[ArchivedRecord], int, int, int], non_negative: tuple[str, ...],
        tombstones: str) -> None:
    _check(segment, _decoding(NESTED, non_negative, tombstones))


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
        decoding = _decoding(ddl, _NON_NEGATIVE[ddl])
        for value in values:
            _same(_records([good, value, good]), decoding)
    for tombstones in ("dead_letter", "pass"):
        decoding = _decoding(ddl, _NON_NEGATIVE[ddl], tombstones)
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
    decoding = _decoding(ddl, _NON_NEGATIVE[ddl], "pass")
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
    _same(_records([too_deep]), _decoding(ddl, _NON_NEGATIVE[ddl]))


def test_json_deeper_than_orjson_reads_is_a_dead_letter_in_a_nested_schemas_segment() -> None:
    too_deep = _GOOD[NESTED][:-1] + b',"x":' + b"[" * (_DEPTH + 1) + b"]" * (_DEPTH + 1) + b"}"
    _, dead = _same(_records([too_deep]), _decoding(NESTED))
    assert [reason.split(":")[0] for *_, reason in dead] == ["not JSON"]


# --- plain tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("ddl", [FLAT, NARROW, NESTED], ids=["flat", "narrow", "nested"])
def test_decoding_an_empty_segment_gives_an_empty_table(ddl: str) -> None:
    decoding = _decoding(ddl)
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
