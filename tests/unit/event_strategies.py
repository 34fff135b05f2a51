"""Hypothesis strategies for events of the test schemas: valid ones and every kind of invalid
one, as raw Kafka values, and archived segments of them (test_decoded_segments.py)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from itertools import product
from typing import Any

from hypothesis import strategies as st

from orchestrator.archive_model.segments import ArchivedRecord
from orchestrator.spark.read.batch_builder import ROWS_PER_ARROW_BATCH

FLAT = "user_id bigint, url string, ts bigint, duration_ms bigint"  # the Arrow fast path
NARROW = "n int, flag boolean, s string, tiny tinyint"  # also the Arrow path
NESTED = ("id bigint, price double, tags array<string>, attrs map<string,bigint>, "
          "loc struct<lat: double, lon: double>, day date, at timestamp, amount decimal(10,2)")
# Fields named like the columns a decoded segment or an events DataFrame adds, which they are
# not (models.RESERVED_FIELDS refuses those): the decode and its readers must keep them apart.
NEAR_RESERVED = ("dead bigint, _deadline string, dead_reason double, Kafka_Offsets bigint, "
                 "_dead_reasons array<string>, at timestamp, amount decimal(10,2)")
EVERYTHING = (-(2**63), 2**63 - 1)  # a range holding every offset

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
_AMOUNT = st.one_of(_CENTS.map(lambda d: _Raw(str(d).encode())), _CENTS.map(str),
                    st.integers(-(10**8), 10**8),
                    st.sampled_from([_Raw(b"1.50"), _Raw(b"1e3"), "1E+2", 1.5, -0.0]))
_WRONG_AMOUNT = st.sampled_from([_Raw(b"1.005"), "1.005", "abc", "", " 1", "12345678.99",
                                 "123456789.00", _Raw(b"123456789"), _Raw(b"-0.001"), "NaN",
                                 "1e400", 1.0e20, True])
_WRONG_AT = st.sampled_from(["2024-01-02T25:00:00Z", "yesterday", "2024-01-02",
                             "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
                             "2024-01-02T03:04:05.1234567890Z", 1_700_000_000])
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
        "amount": _AMOUNT},
    NEAR_RESERVED: {
        "dead": _LONG, "_deadline": _TEXT, "dead_reason": _DOUBLE, "Kafka_Offsets": _LONG,
        "_dead_reasons": st.lists(_TEXT, max_size=3), "at": _timestamps(), "amount": _AMOUNT},
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
        "at": _WRONG_AT, "amount": _WRONG_AMOUNT},
    NEAR_RESERVED: {
        "dead": st.sampled_from([*_BOUNDS[2:6], True, 1.0]), "_deadline": st.integers(0, 1),
        "dead_reason": st.sampled_from(["1.5", True]), "Kafka_Offsets": st.just(False),
        "_dead_reasons": st.sampled_from([["a", 1], "a", [None]]), "at": _WRONG_AT,
        "amount": _WRONG_AMOUNT},
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
# Undeclared fields, some named as the columns a decoded segment or the Kafka metadata add.
_EXTRA_NAMES = st.sampled_from(["extra", "x", "URL", "\u00e9", "", "id ", "_dead", "_DEAD",
                                "_dead_reason", "_dead_value", "kafka_offset", "kafka_topic"])
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
