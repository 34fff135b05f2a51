"""Event schemas as Spark DDL: the parser, the canonical form, and validation at any depth."""

from __future__ import annotations

import ast
import json
import re
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from decimal import Decimal as D
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orchestrator
from orchestrator.errors import JobFileError
from orchestrator.parsing import EventParser
from orchestrator.schema import (
    INTEGER_BITS,
    PRIMITIVES,
    Array,
    DataType,
    Decimal,
    Map,
    Primitive,
    Struct,
    check_non_negative,
    from_flat,
    parse_ddl,
)
from orchestrator.spark.read.arrow import arrow_fields, arrow_type

BIGINT, INT, STRING, DOUBLE = (Primitive(n) for n in ("bigint", "int", "string", "double"))
NESTED = (
    "user_id bigint, address struct<country: string, city: string>, tags array<string>, "
    "amount decimal(12,2), seen timestamp, attrs map<string, bigint>, "
    "order struct<amount: double, items array<struct<sku string, qty int>>>"
)
FLAT = [("user_id", "long"), ("url", "string"), ("ts", "long"), ("duration_ms", "long")]


def _s(**fields: DataType) -> Struct:
    return Struct(tuple(fields.items()))


# Parsing DDL ------------------------------------------------------------------------------

@pytest.mark.parametrize(("ddl", "expected"), [
    ("a bigint", _s(a=BIGINT)),
    ("a LONG, b Int, c integer, d short, e SMALLINT, f byte, g tinyint",
     _s(a=BIGINT, b=INT, c=INT, d=Primitive("smallint"), e=Primitive("smallint"),
        f=Primitive("tinyint"), g=Primitive("tinyint"))),
    ("a double, b float, c real, d string, e boolean, f timestamp, g date",
     _s(a=DOUBLE, b=Primitive("float"), c=Primitive("float"), d=STRING,
        e=Primitive("boolean"), f=Primitive("timestamp"), g=Primitive("date"))),
    ("a decimal, b DEC(5), c numeric(12, 2), d Decimal( 38 , 38 )",
     _s(a=Decimal(10, 0), b=Decimal(5, 0), c=Decimal(12, 2), d=Decimal(38, 38))),
    ("tags array<string>, m array<array<int>>", _s(tags=Array(STRING), m=Array(Array(INT)))),
    ("attrs map<string, bigint>, deep MAP<STRING,map<string,array<double>>>",
     _s(attrs=Map(BIGINT), deep=Map(Map(Array(DOUBLE))))),
    ("address struct<country: string, city string>",
     _s(address=_s(country=STRING, city=STRING))),
    ("o struct<items: array<struct<sku:string,qty:int>>>",
     _s(o=_s(items=Array(_s(sku=STRING, qty=INT))))),
    ("`my field` string, `a``b` int, `x.y` bigint",
     _s(**{"my field": STRING, "a`b": INT, "x.y": BIGINT})),
    ("a bigint NOT NULL, b string not null COMMENT 'the, url > x', c int COMMENT \"it\\\"s\"",
     _s(a=BIGINT, b=STRING, c=INT)),
    ("s struct<a: int NOT NULL COMMENT 'x'>", _s(s=_s(a=INT))),
    ("\n  user_id  bigint ,\n  url\tstring\n", _s(user_id=BIGINT, url=STRING)),
    ("comment string, not int, struct bigint", _s(comment=STRING, **{"not": INT},
                                                  struct=BIGINT)),
    ("Caps bigint", _s(Caps=BIGINT)),
])
def test_ddl_forms(ddl: str, expected: Struct) -> None:
    assert parse_ddl(ddl) == expected


def test_canonical_ddl() -> None:
    schema = parse_ddl(NESTED + ", `a``b` LONG, r real, d dec")
    assert schema.ddl() == (
        "`user_id` bigint, `address` struct<`country`:string,`city`:string>, "
        "`tags` array<string>, `amount` decimal(12,2), `seen` timestamp, "
        "`attrs` map<string,bigint>, "
        "`order` struct<`amount`:double,`items`:array<struct<`sku`:string,`qty`:int>>>, "
        "`a``b` bigint, `r` float, `d` decimal(10,0)"
    )
    assert parse_ddl(schema.ddl()) == schema
    assert _s(a=INT).type_ddl() == "struct<`a`:int>"


@pytest.mark.parametrize(("ddl", "message"), [
    ("user_id strng", "unknown type 'strng' in EVENT_SCHEMA at position 9: types are string, "
                      "long, int,"),
    ("a map<int, string>", "map keys must be string in EVENT_SCHEMA at position 7"),
    ("a map<string>", "expected ',', found '>' in EVENT_SCHEMA at position 13"),
    ("a bigint, A string", "duplicate field 'A' in EVENT_SCHEMA at position 11"),
    ("s struct<a: int, a: int>", "duplicate field 'a' in EVENT_SCHEMA at position 18"),
    ("", "EVENT_SCHEMA is empty"),
    ("  \n ", "EVENT_SCHEMA is empty"),
    ("`` string", "empty field name in EVENT_SCHEMA at position 1"),
    ("`abc string", "unclosed backquote in EVENT_SCHEMA at position 1"),
    ("a bigint,", "expected a field name, found the end of the schema"),
    (", a bigint", "expected a field name, found ','"),
    ("a bigint b string", "expected ',' or the end of the schema, found 'b' in EVENT_SCHEMA at "
                          "position 10: separate fields with commas"),
    ("a", "expected a type for field 'a', found the end of the schema"),
    ("a array<>", "expected a type for the array elements, found '>'"),
    ("a array<string", "expected '>', found the end of the schema"),
    ("a struct<>", "empty struct<> in EVENT_SCHEMA at position 10"),
    ("a struct<b string c int>", "expected '>', found 'c'"),
    ("a decimal(40,2)", "decimal precision 40 is out of range"),
    ("a decimal(0)", "decimal precision 0 is out of range"),
    ("a decimal(4,5)", "decimal scale 5 is more than its precision 4"),
    ("a decimal(x)", "expected a number, found 'x'"),
    ("a bigint not nul", "expected NULL after NOT, found 'nul'"),
    ("a bigint comment x", "expected a quoted comment, found 'x'"),
    ("a bigint comment 'x", "unclosed comment"),
    ("a varchar(3)", "unknown type 'varchar'"),
    ("a.b int", "expected a type for field 'a', found '.'"),
])
def test_ddl_errors_are_one_line(ddl: str, message: str) -> None:
    with pytest.raises(JobFileError) as info:
        parse_ddl(ddl)
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text, text
    assert "EVENT_SCHEMA" in text and ": " in text  # where, and then what to do


# Canonical round trip ---------------------------------------------------------------------

_names = st.text(min_size=1, max_size=6)
_leaves = st.sampled_from([Primitive(n) for n in PRIMITIVES]) | st.integers(1, 38).flatmap(
    lambda p: st.integers(0, p).map(lambda s: Decimal(p, s)))


def _structs(children: st.SearchStrategy[DataType]) -> st.SearchStrategy[Struct]:
    return st.lists(st.tuples(_names, children), min_size=1, max_size=4,
                    unique_by=lambda f: f[0].lower()).map(lambda fs: Struct(tuple(fs)))


_types = st.recursive(_leaves, lambda c: c.map(Array) | c.map(Map) | _structs(c), max_leaves=10)
_schemas = _structs(_types)


@given(_schemas)
@settings(deadline=None)
def test_canonical_ddl_round_trips(schema: Struct) -> None:
    assert parse_ddl(schema.ddl()) == schema


_SPELLINGS = {"bigint": ["bigint", "long"], "int": ["int", "integer"],
              "smallint": ["smallint", "short"], "tinyint": ["tinyint", "byte"],
              "float": ["float", "real"]}


def _messy(draw: st.DrawFn, t: DataType) -> str:
    """Any of the spellings Spark accepts for t: case, synonyms, spaces, colons, modifiers."""
    def word(w: str) -> str:
        return draw(st.sampled_from([w.lower(), w.upper(), w.capitalize()]))

    def sp() -> str:
        return draw(st.sampled_from(["", " ", "\n  "]))

    if isinstance(t, Primitive):
        return word(draw(st.sampled_from(_SPELLINGS.get(t.name, [t.name]))))
    if isinstance(t, Decimal):
        w = word(draw(st.sampled_from(["decimal", "dec", "numeric"])))
        forms = [f"{w}({sp()}{t.precision}{sp()},{sp()}{t.scale}{sp()})"]
        forms += [f"{w}({t.precision})"] if t.scale == 0 else []
        forms += [w] if (t.precision, t.scale) == (10, 0) else []
        return draw(st.sampled_from(forms))
    if isinstance(t, Array):
        return f"{word('array')}<{sp()}{_messy(draw, t.element)}{sp()}>"
    if isinstance(t, Map):
        return f"{word('map')}<{word('string')}{sp()},{sp()}{_messy(draw, t.value)}>"
    return f"{word('struct')}<{_messy_fields(draw, t)}>"


def _messy_fields(draw: st.DrawFn, t: Struct) -> str:
    parts = []
    for name, ft in t.fields:
        bare = re.fullmatch(r"[A-Za-z0-9_]+", name) is not None and draw(st.booleans())
        shown = name if bare else "`" + name.replace("`", "``") + "`"
        colon = draw(st.sampled_from([" ", ":", ": ", " : "]))
        extra = draw(st.sampled_from(["", " NOT NULL", " not null", " COMMENT 'a, b > `c'",
                                      ' comment "it\\"s"', " NOT NULL COMMENT ''"]))
        parts.append(f"{shown}{colon}{_messy(draw, ft)}{extra}")
    return draw(st.sampled_from([",", ", ", " ,\n"])).join(parts)


@given(st.data())
@settings(deadline=None)
def test_every_spelling_parses_to_the_same_tree(data: st.DataObject) -> None:
    schema = data.draw(_schemas)
    assert parse_ddl(data.draw(st.composite(_messy_fields)(schema))) == schema


# The flat form ----------------------------------------------------------------------------

def test_flat_form() -> None:
    schema = from_flat({"user_id": "long", "url": "string", "x": "double", "ok": "boolean"})
    assert schema == _s(user_id=BIGINT, url=STRING, x=DOUBLE, ok=Primitive("boolean"))
    assert schema.ddl() == "`user_id` bigint, `url` string, `x` double, `ok` boolean"
    assert parse_ddl(schema.ddl()) == schema


@pytest.mark.parametrize(("mapping", "message"), [
    ({"x": "int"}, "EVENT_SCHEMA['x'] = 'int': types are long, string, double, boolean"),
    ({"x": "bigint"}, "EVENT_SCHEMA['x'] = 'bigint': types are long, string, double, boolean"),
    ({"x": 3}, "EVENT_SCHEMA['x'] = 3: types are long, string, double, boolean"),
    ({"x": ["long"]}, "EVENT_SCHEMA['x'] = ['long']: types are long, string, double, boolean"),
    ({1: "long"}, "EVENT_SCHEMA[1] = 'long': types are long, string, double, boolean"),
    ({"": "long"}, "EVENT_SCHEMA has a field with an empty name"),
    ({}, "EVENT_SCHEMA must be a non-empty dict of field -> type"),
    ({"a": "long", "A": "long"}, "EVENT_SCHEMA declares 'A' twice (ignoring case)"),
])
def test_flat_form_errors(mapping: dict[str, Any], message: str) -> None:
    with pytest.raises(JobFileError) as info:
        from_flat(mapping)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_flat_parser_messages_are_unchanged() -> None:
    parser = EventParser(FLAT, ["duration_ms"])
    assert parser.fields == ("user_id", "url", "ts", "duration_ms")
    assert parser.parse(b'{"user_id": 1, "url": "/A?x", "ts": 5, "duration_ms": 0, "z": []}') \
        == ((1, "/A?x", 5, 0), None)
    try:
        orjson.loads(b"not json")
    except orjson.JSONDecodeError as exc:
        not_json = f"not JSON: {str(exc)[:120]}"
    cases = {
        None: "empty value (tombstone)",
        b"not json": not_json,
        b"[1]": "not a JSON object: list",
        b'{"user_id": 1, "url": "/", "ts": 5}': "missing field duration_ms",
        b'{"user_id": "1", "url": "/", "ts": 5, "duration_ms": 1}':
            "field user_id is not a long: str",
        b'{"user_id": true, "url": "/", "ts": 5, "duration_ms": 1}':
            "field user_id is not a long: bool",
        b'{"user_id": null, "url": "/", "ts": 5, "duration_ms": 1}':
            "field user_id is not a long: NoneType",
        b'{"user_id": 9223372036854775808, "url": "/", "ts": 5, "duration_ms": 1}':
            "field user_id is not a long: int",
        b'{"user_id": 1, "url": "/", "ts": 5, "duration_ms": 1.5}':
            "field duration_ms is not a long: float",
        b'{"user_id": 1, "url": 3, "ts": 5, "duration_ms": 1}': "field url is not a string: int",
        b'{"user_id": 1, "url": "/", "ts": 5, "duration_ms": -1}': "field duration_ms is negative",
    }
    for raw, message in cases.items():
        assert parser.parse(raw) == (None, message), raw
    doubles = EventParser([("x", "double"), ("b", "boolean")])
    values, _ = doubles.parse(b'{"x": 3, "b": false}')
    assert values == (3.0, False) and type(values[0]) is float
    assert doubles.parse(b'{"x": "3", "b": false}') == (None, "field x is not a double: str")
    assert doubles.parse(b'{"x": 3, "b": 0}') == (None, "field b is not a boolean: int")


def test_flat_schemas_keep_the_fast_json_parser() -> None:
    assert EventParser(FLAT)._loads is orjson.loads
    assert EventParser(parse_ddl("a bigint, b array<struct<c double>>"))._loads is orjson.loads
    assert EventParser(parse_ddl("a bigint, b array<decimal(5,2)>"))._loads is not orjson.loads


# Validation at depth ----------------------------------------------------------------------

def _event(**changes: Any) -> bytes:
    event: dict[str, Any] = {
        "user_id": 7, "address": {"country": "FR", "city": "Lyon", "zip": "69001"},
        "tags": ["a", "b"], "amount": "12.50", "seen": "2024-01-02T03:04:05Z",
        "attrs": {"k": 1}, "order": {"amount": 3, "items": [{"sku": "x", "qty": 2}]},
        "extra": {"ignored": True},
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = event
        for p in parents:
            target = target[p]
        if value is _MISSING:
            del target[last]
        else:
            target[last] = value
    return json.dumps(event).encode()


_MISSING = object()


def test_nested_event_values() -> None:
    parser = EventParser(parse_ddl(NESTED), ["user_id", "order.amount", "amount"])
    assert parser.fields == ("user_id", "address", "tags", "amount", "seen", "attrs", "order")
    values, error = parser.parse(_event())
    assert error is None and values == (
        7, {"country": "FR", "city": "Lyon"}, ["a", "b"], D("12.50"),
        datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), {"k": 1},
        {"amount": 3.0, "items": [{"sku": "x", "qty": 2}]},
    )
    assert type(values[6]["amount"]) is float


@pytest.mark.parametrize(("changes", "message"), [
    ({"address__city": _MISSING}, "missing field address.city"),
    ({"address": _MISSING}, "missing field address"),
    ({"address": ["FR"]}, "field address is not a struct: list"),
    ({"address__city": None}, "field address.city is not a string: NoneType"),
    ({"tags": ["a", "b", 3]}, "field tags[2] is not a string: int"),
    ({"tags": ["a", None]}, "field tags[1] is not a string: NoneType"),
    ({"tags": {"0": "a"}}, "field tags is not an array: dict"),
    ({"tags": None}, "field tags is not an array: NoneType"),
    ({"attrs": {"a": 1, "k": 1.5}}, "field attrs['k'] is not a long: float"),
    ({"attrs": {"it's": None}}, "field attrs[\"it's\"] is not a long: NoneType"),
    ({"attrs": [1]}, "field attrs is not a map: list"),
    ({"order__items": [{"sku": "x", "qty": 1}, {"sku": "y", "qty": "2"}]},
     "field order.items[1].qty is not an integer: str"),
    ({"order__items": [{"sku": "x", "qty": 2**31}]},
     "field order.items[0].qty is not an integer: int"),
    ({"order__items": [{"qty": 1}]}, "missing field order.items[0].sku"),
    ({"order__amount": True}, "field order.amount is not a double: bool"),
    ({"order__amount": -0.5}, "field order.amount is negative"),
    ({"amount": "-0.01"}, "field amount is negative"),
    ({"user_id": -1}, "field user_id is negative"),
    ({"amount": 1.234}, "field amount does not fit decimal(12,2): 1.234"),
    ({"amount": "abc"}, "field amount is not a decimal(12,2): 'abc'"),
    ({"amount": False}, "field amount is not a decimal(12,2): bool"),
    ({"seen": 1704164645}, "field seen is not a timestamp: int"),
    ({"seen": "2024-01-02"}, "field seen is not a timestamp: '2024-01-02'"),
])
def test_nested_event_errors(changes: dict[str, Any], message: str) -> None:
    parser = EventParser(parse_ddl(NESTED), ["user_id", "order.amount", "amount"])
    assert parser.parse(_event(**changes)) == (None, message)


def test_not_json_is_judged_alike_with_decimals() -> None:
    parser = EventParser(parse_ddl("a decimal(5,2)"))
    for raw in (b'{"a": NaN}', b'{"a": "\\ud800"}', b'{"a": 1', b"\xef\xbb\xbf{}", b"[" * 1200):
        values, error = parser.parse(raw)
        assert values is None and error is not None and error.startswith("not JSON: "), raw
    assert parser.parse(b"1.5") == (None, "not a JSON object: float")


@pytest.mark.parametrize(("text", "expected"), [
    ("2024-01-02T03:04:05Z", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ("2024-01-02T05:04:05+02:00", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ("2024-01-01T22:34:05-0430", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ("2024-01-02T03:04:05", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ("2024-01-02 03:04:05z", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ("2024-01-02t03:04", datetime(2024, 1, 2, 3, 4, tzinfo=UTC)),
    ("2024-01-02T03:04:05.5Z", datetime(2024, 1, 2, 3, 4, 5, 500_000, tzinfo=UTC)),
    ("2024-01-02T03:04:05.123456789+00:00",
     datetime(2024, 1, 2, 3, 4, 5, 123_456, tzinfo=UTC)),
])
def test_timestamps(text: str, expected: datetime) -> None:
    values, error = EventParser(parse_ddl("t timestamp")).parse(json.dumps({"t": text}).encode())
    assert error is None and values is not None
    assert values[0] == expected and values[0].utcoffset() == timedelta(0)
    assert values[0].tzinfo is UTC


@pytest.mark.parametrize("value", [
    1704164645, 1.5, True, None, "2024-01-02", "2024-13-02T00:00:00Z", "2024-01-02T25:00:00Z",
    "yesterday", "20240102T030405", "2024-W01-1T00:00", "0001-01-01T00:00:00+01:00",
    "2024-01-02T03:04:05Z ", "\uff12024-01-02T03:04:05Z",
])
def test_bad_timestamps(value: Any) -> None:
    _, error = EventParser(parse_ddl("t timestamp")).parse(json.dumps({"t": value}).encode())
    assert error is not None and error.startswith("field t is not a timestamp: ")


def test_dates() -> None:
    parser = EventParser(parse_ddl("d date"))
    assert parser.parse(b'{"d": "2024-02-29"}') == ((date(2024, 2, 29),), None)
    for bad, shown in [('"2023-02-29"', "'2023-02-29'"), ("20240102", "int"),
                       ('"2024-01-02T00:00:00"', "'2024-01-02T00:00:00'"),
                       ('"2024-1-2"', "'2024-1-2'")]:
        assert parser.parse(b'{"d": %s}' % bad.encode()) == (
            None, f"field d is not a date: {shown}")


@pytest.mark.parametrize(("raw", "expected"), [
    ("1.23", D("1.23")), ('"1.23"', D("1.23")), ("10", D("10.00")), ("1.5", D("1.5")),
    ("1.230", D("1.23")), ("1e2", D("100")), ('"-1E+2"', D("-100")), ("-0.0", D("0")),
    ("9999999999.99", D("9999999999.99")), ('"+.5"', D("0.5")), ("0.000000000", D(0)),
])
def test_decimals(raw: str, expected: D) -> None:
    values, error = EventParser(parse_ddl("a decimal(12,2)")).parse(b'{"a": %s}' % raw.encode())
    assert error is None and values is not None
    assert values[0] == expected and type(values[0]) is D and values[0].as_tuple().exponent == -2


@pytest.mark.parametrize(("raw", "shown"), [
    ("99999999999", "99999999999"), ("1.234", "1.234"), ('"1e-3"', "1e-3"),
    ("12345678901.5", "12345678901.5"), ('"1e999999999999999999999"', "1e999999999999999999999"),
])
def test_decimals_that_do_not_fit(raw: str, shown: str) -> None:
    parser = EventParser(parse_ddl("a decimal(12,2)"))
    assert parser.parse(b'{"a": %s}' % raw.encode()) == (
        None, f"field a does not fit decimal(12,2): {shown}")


@pytest.mark.parametrize("raw", ['"NaN"', '"1_000"', '" 1"', '"0x10"', '""', '"1.2.3"', "[1]"])
def test_decimal_text_must_be_a_number(raw: str) -> None:
    _, error = EventParser(parse_ddl("a decimal(12,2)")).parse(b'{"a": %s}' % raw.encode())
    assert error is not None and error.startswith("field a is not a decimal(12,2): ")


def test_decimals_are_exact() -> None:
    parser = EventParser(parse_ddl("a decimal(38,18), b decimal(38,37), c double, "
                                   "d array<double>, e decimal(38,0), f float"))
    raw = (b'{"a": 12345678901234567890.123456789012345678, "b": 0.1, "c": 0.1, "d": [0.1, 2],'
           b' "e": 99999999999999999999999999999999999999, "f": 1e300}')
    values, error = parser.parse(raw)
    assert error is None and values is not None
    a, b, c, d, e, f = values
    assert a == D("12345678901234567890.123456789012345678")
    assert b == D("0.1") and b.as_tuple().exponent == -37
    assert c == 0.1 and type(c) is float and d == [0.1, 2.0] and type(d[1]) is float
    assert e == 10**38 - 1 and f == 1e300 and type(f) is float
    too_big = raw.replace(b"99999999999999999999999999999999999999",
                          b"100000000000000000000000000000000000000")
    assert parser.parse(too_big)[1] == (
        "field e does not fit decimal(38,0): 100000000000000000000000000000000000000")
    # orjson judges what is JSON for every schema: no double is infinite
    assert parser.parse(raw.replace(b'"c": 0.1', b'"c": 1e400'))[1] == (
        "not JSON: number is infinity when parsed as double: line 1 column 63 (char 62)")
    assert parser.parse(raw.replace(b'"c": 0.1', b'"c": "0.1"'))[1] == (
        "field c is not a double: str")


def test_integer_ranges() -> None:
    parser = EventParser(parse_ddl("a tinyint, b smallint, c int, d bigint"))
    ok = b'{"a": -128, "b": 32767, "c": -2147483648, "d": 9223372036854775807}'
    assert parser.parse(ok) == ((-128, 32767, -2147483648, 2**63 - 1), None)
    assert parser.parse(ok.replace(b"-128", b"128"))[1] == "field a is not a byte: int"
    assert parser.parse(ok.replace(b"32767", b"32768"))[1] == "field b is not a short: int"
    assert parser.parse(ok.replace(b"-2147483648", b"2147483648"))[1] == (
        "field c is not an integer: int")
    assert parser.parse(ok.replace(b"-128", b"1.0"))[1] == "field a is not a byte: float"


# NON_NEGATIVE -----------------------------------------------------------------------------

def test_field_path() -> None:
    schema = parse_ddl(NESTED)
    assert schema.field_path("order.amount") == DOUBLE
    assert schema.field_path("address") == _s(country=STRING, city=STRING)
    assert schema.field_path("user_id") == BIGINT
    for missing in ("order.items.qty", "attrs.k", "nope", "order.nope", "user_id.x", "",
                    "order."):
        assert schema.field_path(missing) is None, missing


def test_check_non_negative() -> None:
    schema = parse_ddl(NESTED + ", small tinyint, f float")
    check_non_negative(schema, ["user_id", "amount", "order.amount", "small", "f"])
    for path, message in [
        ("order.items.qty", "NON_NEGATIVE names 'order.items.qty', which is not an event field"),
        ("Order.amount", "NON_NEGATIVE names 'Order.amount', which is not an event field"),
        ("address.city", "NON_NEGATIVE names 'address.city', a string field: only numeric"),
        ("seen", "NON_NEGATIVE names 'seen', a timestamp field: only numeric"),
        ("address", "NON_NEGATIVE names 'address', a struct<`country`:string,`city`:string> "
                    "field"),
    ]:
        with pytest.raises(JobFileError) as info:
            check_non_negative(schema, [path])
        assert str(info.value).startswith(message) and "\n" not in str(info.value)
    with pytest.raises(JobFileError):
        EventParser(FLAT, ["url"])
    with pytest.raises(JobFileError):
        EventParser(schema, ["order.items"])


# Any valid event, at any depth, parses to its values and fits the Arrow type ---------------

def _values(t: DataType) -> st.SearchStrategy[tuple[str, Any]]:
    """(JSON text of a valid value of t, the value the parser should return)."""
    text = st.text(st.characters(exclude_categories=["Cs"]), max_size=4)
    if isinstance(t, Primitive):
        if t.name in INTEGER_BITS:
            half = 2 ** (INTEGER_BITS[t.name] - 1)
            return st.integers(-half, half - 1).map(lambda i: (str(i), i))
        if t.name in ("double", "float"):
            floats = st.floats(allow_nan=False, allow_infinity=False,
                               width=64 if t.name == "double" else 32)
            return floats.map(lambda f: (repr(f), f))
        if t.name == "string":
            return text.map(lambda s: (json.dumps(s), s))
        if t.name == "boolean":
            return st.booleans().map(lambda b: (json.dumps(b), b))
        if t.name == "date":
            return st.dates().map(lambda d: (f'"{d.isoformat()}"', d))
        zones: list[tzinfo | None] = [None, UTC, timezone(timedelta(hours=2)),
                                      timezone(-timedelta(hours=5, minutes=30))]
        return st.datetimes(datetime(2, 1, 1), datetime(9998, 12, 31),
                            timezones=st.sampled_from(zones)).map(
            lambda d: (f'"{d.isoformat()}"', d if d.tzinfo else d.replace(tzinfo=UTC)))
    if isinstance(t, Decimal):
        # From integers: st.decimals rounds to the default 28 digits.
        top = 10**t.precision - 1
        decimals = st.integers(-top, top).map(lambda i: D(f"{i}E-{t.scale}"))
        return decimals.flatmap(
            lambda d: st.sampled_from([str(d), f'"{d}"']).map(lambda s: (s, d)))
    if isinstance(t, Array):
        return st.lists(_values(t.element), max_size=3).map(
            lambda items: ("[" + ",".join(s for s, _ in items) + "]", [v for _, v in items]))
    if isinstance(t, Map):
        return st.dictionaries(text, _values(t.value), max_size=3).map(
            lambda m: ("{" + ",".join(f"{json.dumps(k)}:{s}" for k, (s, _) in m.items()) + "}",
                       {k: v for k, (_, v) in m.items()}))
    names = [name for name, _ in t.fields]

    def obj(vs: tuple[tuple[str, Any], ...]) -> tuple[str, Any]:
        pairs = list(zip(names, vs, strict=True))
        return ("{" + ",".join(f"{json.dumps(n)}:{s}" for n, (s, _) in pairs) + "}",
                {n: v for n, (_, v) in pairs})
    return st.tuples(*(_values(ft) for _, ft in t.fields)).map(obj)


def _from_arrow(t: DataType, v: Any) -> Any:
    """Arrow gives maps back as (key, value) lists: make them dicts again."""
    if v is None:
        return v
    if isinstance(t, Array):
        return [_from_arrow(t.element, x) for x in v]
    if isinstance(t, Map):
        return {k: _from_arrow(t.value, x) for k, x in v}
    if isinstance(t, Struct):
        return {n: _from_arrow(ft, v[n]) for n, ft in t.fields}
    return v


@given(st.data())
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_valid_events_parse_and_fit_arrow(data: st.DataObject) -> None:
    schema = data.draw(_schemas)
    text, expected = data.draw(_values(schema))
    values, error = EventParser(schema).parse(text.encode())
    assert error is None, error
    assert values == tuple(expected[n] for n in schema.names)
    row = dict(zip(schema.names, values, strict=True))
    back = pa.array([row], type=pa.struct(arrow_fields(schema))).to_pylist()[0]
    assert _from_arrow(schema, back) == row


def test_arrow_types_and_a_nested_round_trip() -> None:
    schema = parse_ddl(NESTED + ", d date, b boolean, s smallint, t tinyint, f float")
    assert [f.type for f in arrow_fields(schema)] == [
        pa.int64(),
        pa.struct([pa.field("country", pa.string()), pa.field("city", pa.string())]),
        pa.list_(pa.string()), pa.decimal128(12, 2), pa.timestamp("us", tz="UTC"),
        pa.map_(pa.string(), pa.int64()),
        pa.struct([pa.field("amount", pa.float64()), pa.field("items", pa.list_(pa.struct(
            [pa.field("sku", pa.string()), pa.field("qty", pa.int32())])))]),
        pa.date32(), pa.bool_(), pa.int16(), pa.int8(), pa.float32(),
    ]
    parser = EventParser(schema)
    raw = (b'{"user_id": 7, "address": {"country": "FR", "city": "Lyon"}, "tags": ["a", "b"],'
           b' "amount": 12.5, "seen": "2024-01-02T05:04:05.123456+02:00", "attrs": {"k": 1},'
           b' "order": {"amount": 3, "items": [{"sku": "x", "qty": 2}, {"sku": "y", "qty": 3}]},'
           b' "d": "2024-02-29", "b": true, "s": -3, "t": 4, "f": 0.5}')
    values, error = parser.parse(raw)
    assert error is None and values is not None
    for (_, t), value in zip(schema.fields, values, strict=True):
        column = pa.array([value, value], type=arrow_type(t))
        assert [_from_arrow(t, v) for v in column.to_pylist()] == [value, value]
    assert values[4] == datetime(2024, 1, 2, 3, 4, 5, 123_456, tzinfo=UTC)
    assert values[3] == D("12.50")


# The domain layer stays free of drivers -----------------------------------------------------

def test_schema_and_parsing_import_no_driver() -> None:
    drivers = {"pyspark", "pyarrow", "confluent_kafka", "psycopg", "airflow", "prometheus_client"}
    package = Path(orchestrator.__file__).parent
    for name in ("schema.py", "parsing.py"):
        tree = ast.parse((package / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module}
        assert not {i for i in imported if i.split(".")[0] in drivers}, name
