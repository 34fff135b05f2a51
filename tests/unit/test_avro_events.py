"""Avro events (#62, pure part): the registry's wire format, the Spark schema derived from an
Avro reader schema, and the parser, held to a reference decode with fastavro's own schemaless
reader and schema resolution over generated schemas, evolved readers and garbled bytes."""

from __future__ import annotations

import decimal
import io
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import JobFileError
from orchestrator.formats import wire
from orchestrator.formats.avro_events import AvroEventParser
from orchestrator.formats.avro_types import event_struct

# Deterministic examples: a test of the suite never fails by chance.
_SETTINGS = settings(max_examples=60, derandomize=True, database=None)


# --- the wire format -------------------------------------------------------------------------

def test_the_wire_format_and_its_dead_letter_reasons() -> None:
    framed = wire.split(wire.frame(258, b"body"))
    assert (framed.schema_id, framed.body) == (258, b"body")
    with pytest.raises(wire.FrameError, match=r"^not in the schema registry's wire format: 3 "
                       r"bytes, fewer than its 5-byte header$"):
        wire.split(b"\x00\x00\x01")
    with pytest.raises(wire.FrameError, match=r"no magic byte \(the first byte is 0x7b, not "
                       r"0x00\)$"):
        wire.split(b'{"user_id": 1}')
    with pytest.raises(wire.FrameError, match="truncated message indexes"):
        wire.message_indexes(b"\x04\x80")


@_SETTINGS
@given(st.lists(st.integers(0, 2**31), min_size=1, max_size=5), st.binary(max_size=8))
def test_message_indexes_as_confluents_protobuf_serializer_writes_them(
        indexes: list[int], message: bytes) -> None:
    from confluent_kafka.schema_registry._sync.protobuf import ProtobufSerializer

    written = io.BytesIO()
    ProtobufSerializer._encode_varints(written, indexes)
    assert wire.frame(7, message, tuple(indexes)) == wire.frame(7, written.getvalue() + message)
    assert wire.message_indexes(written.getvalue() + message) == (tuple(indexes), message)


# --- the Spark schema of a reader schema -----------------------------------------------------

def _record(name: str, *fields: tuple[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, **more,
            "fields": [{"name": n, "type": t} for n, t in fields]}


def test_the_spark_schema_is_derived_from_the_reader_schema() -> None:
    address = _record("Address", ("city", "string"), ("zip", ["null", "int"]))
    schema = _record(
        "PageView", ("user_id", "long"), ("url", "string"), ("ok", "boolean"),
        ("ratio", "float"), ("score", "double"), ("count", "int"),
        ("at", {"type": "long", "logicalType": "timestamp-millis"}),
        ("at_us", {"type": "long", "logicalType": "timestamp-micros"}),
        ("day", {"type": "int", "logicalType": "date"}),
        ("amount", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}),
        ("fixed_amount", {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal",
                          "precision": 18, "scale": 4}),
        ("id", {"type": "string", "logicalType": "uuid"}),
        ("color", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}),
        ("tags", {"type": "array", "items": "string"}),
        ("attrs", {"type": "map", "values": ["null", "long"]}),
        ("home", address), ("work", ["null", "shop.Address"]),
        ("colors", {"type": "array", "items": "shop.Color"}), namespace="shop")
    assert event_struct(schema).ddl() == (
        "`user_id` bigint, `url` string, `ok` boolean, `ratio` float, `score` double, "
        "`count` int, `at` timestamp, `at_us` timestamp, `day` date, `amount` decimal(12,2), "
        "`fixed_amount` decimal(18,4), `id` string, `color` string, `tags` array<string>, "
        "`attrs` map<string,bigint>, `home` struct<`city`:string,`zip`:int>, "
        "`work` struct<`city`:string,`zip`:int>, `colors` array<string>")


@pytest.mark.parametrize(("field_type", "message"), [
    ("bytes", "field blob is of Avro type bytes, which has no Spark type here"),
    ({"type": "fixed", "name": "F", "size": 4}, "field blob is of Avro type fixed"),
    (["null", "long", "string"], "field blob is a union of null | long | string (only null and "
                                 "one other type map to a Spark type), which has no Spark type"),
    ({"type": "long", "logicalType": "local-timestamp-millis"},
     "field blob is a local timestamp (no time zone)"),
    ({"type": "int", "logicalType": "time-millis"}, "field blob is a time of day"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2},
     "field blob is a decimal of precision 40 (Spark holds 1 to 38)"),
    ({"type": "array", "items": ["int", "string"]}, "field blob[] is a union of int | string"),
    (_record("Inner", ("deep", "bytes")), "field blob.deep is of Avro type bytes"),
])
def test_a_type_without_a_spark_type_is_refused_naming_its_field(field_type: Any,
                                                                  message: str) -> None:
    with pytest.raises(JobFileError, match="^the Avro reader schema: " + _escaped(message)):
        event_struct(_record("E", ("ok", "long"), ("blob", field_type)))


def test_a_record_that_contains_itself_two_names_alike_and_no_record_are_refused() -> None:
    node = _record("Node", ("value", "long"), ("next", ["null", "Node"]))
    with pytest.raises(JobFileError, match=r"field next is record Node, which contains itself"):
        event_struct(node)
    with pytest.raises(JobFileError, match="fields userId and userid differ only in case"):
        event_struct(_record("E", ("userId", "long"), ("userid", "long")))
    with pytest.raises(JobFileError, match="is not a record schema"):
        event_struct({"type": "array", "items": "long"})
    with pytest.raises(JobFileError, match=r"is not a valid Avro schema: .*nope"):
        event_struct(_record("E", ("a", "nope")))


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


# --- values of generated schemas -------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WIDE = decimal.Context(prec=40)  # scaleb under the default 28 digits would round the value
# Avro names are unique within a schema; drawn, so that the examples do not depend on what ran
# before in the process.
_NAME = st.uuids().map(lambda u: u.hex[:16])


@st.composite
def _decimal_type(draw: st.DrawFn) -> tuple[Any, st.SearchStrategy[Any]]:
    precision = draw(st.integers(1, 38))
    scale = draw(st.integers(0, precision))
    kind: dict[str, Any] = {"type": "bytes"} if draw(st.booleans()) else {
        "type": "fixed", "name": "Fixed" + draw(_NAME), "size": 16}
    values = st.integers(-(10**precision) + 1, 10**precision - 1).map(
        lambda n: Decimal(n).scaleb(-scale, context=_WIDE))
    return {**kind, "logicalType": "decimal", "precision": precision, "scale": scale}, values


_MILLIS = st.integers(-(2**41), 2**41).map(lambda ms: _EPOCH + timedelta(milliseconds=ms))
_MICROS = st.integers(-(2**51), 2**51).map(lambda us: _EPOCH + timedelta(microseconds=us))
_LEAVES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    ("boolean", st.booleans()),
    ("int", st.integers(-(2**31), 2**31 - 1)),
    ("long", st.integers(-(2**63), 2**63 - 1)),
    ("float", st.floats(width=32, allow_nan=False)),
    ("double", st.floats(allow_nan=False)),
    ("string", st.text(max_size=8)),
    ({"type": "long", "logicalType": "timestamp-millis"}, _MILLIS),
    ({"type": "long", "logicalType": "timestamp-micros"}, _MICROS),
    ({"type": "int", "logicalType": "date"}, st.dates(date(1, 1, 1), date(9999, 12, 31))),
    ({"type": "string", "logicalType": "uuid"}, st.uuids()),
]


@st.composite
def _leaf(draw: st.DrawFn) -> tuple[Any, st.SearchStrategy[Any]]:
    if draw(st.integers(0, 9)) == 0:
        return draw(_decimal_type())
    if draw(st.integers(0, 9)) == 0:
        symbols = draw(st.lists(st.from_regex(r"[A-Z][A-Z0-9_]{0,3}", fullmatch=True),
                                min_size=1, max_size=4, unique=True))
        return {"type": "enum", "name": "Enum" + draw(_NAME), "symbols": symbols}, \
            st.sampled_from(symbols)
    return draw(st.sampled_from(_LEAVES))


def _nest(children: st.SearchStrategy[tuple[Any, st.SearchStrategy[Any]]]
          ) -> st.SearchStrategy[tuple[Any, st.SearchStrategy[Any]]]:
    def array(child: tuple[Any, Any]) -> tuple[Any, Any]:
        return {"type": "array", "items": child[0]}, st.lists(child[1], max_size=3)

    def mapping(child: tuple[Any, Any]) -> tuple[Any, Any]:
        return {"type": "map", "values": child[0]}, st.dictionaries(
            st.text(max_size=4), child[1], max_size=3)

    def nullable(child: tuple[Any, Any]) -> tuple[Any, Any]:
        if isinstance(child[0], list):  # a union in a union is not Avro
            return child
        return ["null", child[0]], st.none() | child[1]

    return st.one_of(children.map(array), children.map(mapping), children.map(nullable),
                     _records(st.lists(children, min_size=1, max_size=3)))


def _records(fields: st.SearchStrategy[list[tuple[Any, Any]]]
             ) -> st.SearchStrategy[tuple[Any, Any]]:
    return st.tuples(fields, _NAME).map(lambda drawn: _record_of(*drawn))


def _record_of(fields: list[tuple[Any, Any]], name: str) -> tuple[Any, Any]:
    names = [f"f{i}" for i in range(len(fields))]
    schema = {"type": "record", "name": "Rec" + name,
              "fields": [{"name": n, "type": t} for n, (t, _) in zip(names, fields, strict=True)]}
    return schema, st.fixed_dictionaries({n: v for n, (_, v) in
                                          zip(names, fields, strict=True)})


_TYPES = st.recursive(_leaf(), _nest, max_leaves=6)
_WRITERS = _records(st.lists(_TYPES, min_size=1, max_size=5))


def _reader_of(writer: dict[str, Any], dropped: list[bool], added: int) -> dict[str, Any]:
    """The writer's record with some fields removed and ``added`` fields added with defaults,
    as a later version of the job reads it; ints promoted to longs and floats to doubles."""
    promoted = {"int": "long", "float": "double"}
    fields = [{**f, "type": promoted.get(f["type"], f["type"])} if isinstance(f["type"], str)
              else f for f, drop in zip(writer["fields"], dropped, strict=False) if not drop]
    fields += [{"name": f"added{i}", "type": ["null", "string"] if i % 2 else "long",
                "default": None if i % 2 else 7} for i in range(added)]
    return {**writer, "fields": fields or [{"name": "added", "type": "long", "default": 1}]}


def _reference(value: bytes, writers: dict[int, Any], reader: Any) -> dict[str, Any] | None:
    """fastavro's own decode of a framed value: the record, or None for a dead letter."""
    if len(value) < 5 or value[0] != 0:
        return None
    schema_id = int.from_bytes(value[1:5], "big", signed=True)
    if schema_id not in writers:
        return None
    body = io.BytesIO(value[5:])
    try:
        record = fastavro.schemaless_reader(body, fastavro.parse_schema(writers[schema_id]),
                                            fastavro.parse_schema(reader))
    except Exception:
        return None
    whole = body.tell() == len(value) - 5
    return record if whole and _fits(reader, record) else None


def _fits(schema: Any, v: Any) -> bool:
    """Avro's rule that fastavro leaves to the reader: a decimal has at most its precision's
    digits (garbled bytes can decode to more)."""
    if isinstance(schema, list):
        return v is None or _fits(next(b for b in schema if b != "null"), v)
    if not isinstance(schema, dict):
        return True
    if schema.get("logicalType") == "decimal":  # (the writers here keep the reader's scale)
        return bool(v == 0 or v.adjusted() < schema["precision"] - schema.get("scale", 0))
    if schema.get("type") == "record":
        return all(_fits(f["type"], v[f["name"]]) for f in schema["fields"])
    if schema.get("type") == "array":
        return all(_fits(schema["items"], x) for x in v)
    if schema.get("type") == "map":
        return all(_fits(schema["values"], x) for x in v.values())
    return True


def _plain(v: Any) -> Any:
    """A decoded value as the parser hands it on: uuids as text."""
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _encoded(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


@_SETTINGS
@given(st.data(), _WRITERS, st.lists(st.booleans(), max_size=5), st.integers(0, 2))
def test_records_read_as_fastavros_own_decode_and_resolution_reads_them(
        data: st.DataObject, writer: tuple[Any, Any], dropped: list[bool], added: int) -> None:
    schema, records = writer
    reader = _reader_of(schema, dropped, added)
    parser = AvroEventParser(reader, {41: schema}.get)
    for record in data.draw(st.lists(records, min_size=1, max_size=3)):
        value = wire.frame(41, _encoded(schema, record))
        expected = _reference(value, {41: schema}, reader)
        assert expected is not None
        values, error = parser.parse(value)
        assert error is None
        assert values == tuple(_plain(expected[name]) for name in parser.fields)
    assert parser.writer_ids == {41}


@_SETTINGS
@given(st.data(), _WRITERS)
def test_garbled_bytes_are_dead_letters_exactly_where_fastavro_fails(
        data: st.DataObject, writer: tuple[Any, Any]) -> None:
    schema, records = writer
    value = bytearray(wire.frame(41, _encoded(schema, data.draw(records))))
    cut = data.draw(st.integers(0, len(value)))
    garbled = data.draw(st.sampled_from([
        bytes(value[:cut]), bytes(value) + data.draw(st.binary(min_size=1, max_size=3)),
        bytes(value[:cut]) + bytes([data.draw(st.integers(0, 255))]) + bytes(value[cut + 1:]),
    ]))
    parser = AvroEventParser(schema, {41: schema}.get)
    expected = _reference(garbled, {41: schema}, schema)
    values, error = parser.parse(garbled)
    if expected is None:
        assert values is None and error, error
    else:
        assert error is None and values == tuple(_plain(expected[n]) for n in parser.fields)


def test_each_dead_letter_says_why() -> None:
    v1 = _record("PageView", ("user_id", "long"), ("url", "string"))
    v2 = _record("PageView", ("user_id", "long"), ("url", "string"))
    v2["fields"].append({"name": "referrer", "type": ["null", "string"], "default": None})
    reader = {**v2, "fields": [*v2["fields"], {"name": "amount", "type": "long"}]}
    looked_up: list[int] = []

    def writers(schema_id: int) -> dict[str, Any] | None:
        looked_up.append(schema_id)
        return {1: v1, 2: v2}.get(schema_id)

    parser = AvroEventParser(v2, writers, non_negative=["user_id"])
    good = wire.frame(1, _encoded(v1, {"user_id": 5, "url": "/a"}))
    assert parser.parse(good) == ((5, "/a", None), None)
    assert parser.parse(wire.frame(2, _encoded(v2, {"user_id": 6, "url": "/b",
                                                    "referrer": "/c"}))) == ((6, "/b", "/c"), None)
    assert parser.parse(None) == (None, "empty value (tombstone)")
    assert parser.parse(wire.frame(9, b"\x02")) == (
        None, "unknown schema id 9: the schema registry has no schema with that id")
    assert parser.parse(wire.frame(1, _encoded(v1, {"user_id": -1, "url": "/a"}))) == (
        None, "field user_id is negative")
    assert parser.parse(good + b"\x00") == (
        None, "not Avro of writer schema 1: 1 bytes left over after the record")
    assert parser.parse(good[:-1])[1].startswith("not Avro of writer schema 1: ")
    assert parser.parse(b"\x01" + good[1:])[1] == (
        "not in the schema registry's wire format: no magic byte (the first byte is 0x01, "
        "not 0x00)")
    # Each id is asked for once, the unknown one too.
    parser.parse(wire.frame(9, b"\x02"))
    assert sorted(looked_up) == [1, 2, 9]
    assert parser.writer_ids == {1, 2}
    # A field the writer lacks and the reader gives no default: not resolvable.
    strict = AvroEventParser(reader, writers)
    assert strict.parse(good)[1] == (
        "writer schema 1 cannot be read with the reader schema: No default value for field "
        "amount in PageView")


def test_a_decimal_written_finer_than_the_reader_holds_is_a_dead_letter() -> None:
    def money(scale: int) -> dict[str, Any]:
        return _record("Sale", ("amount", {"type": "bytes", "logicalType": "decimal",
                                           "precision": 10, "scale": scale}))

    parser = AvroEventParser(money(2), {1: money(3)}.get)
    assert parser.parse(wire.frame(1, _encoded(money(3), {"amount": Decimal("1.250")}))) == (
        (Decimal("1.25"), ), None)
    assert parser.parse(wire.frame(1, _encoded(money(3), {"amount": Decimal("1.255")}))) == (
        None, "field amount does not fit decimal(10,2): 1.255")


def test_a_registry_that_cannot_be_reached_is_not_a_dead_letter() -> None:
    class Away(Exception):
        pass

    def unreachable(schema_id: int) -> dict[str, Any] | None:
        raise Away(f"schema {schema_id}: connection refused")

    parser = AvroEventParser(_record("E", ("a", "long")), unreachable)
    with pytest.raises(Away):
        parser.parse(wire.frame(3, b"\x02"))
