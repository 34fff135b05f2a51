"""The archive's columnar read path against the Kafka path: the same records give the same rows
and the same dead letters, reason for reason, and a segment's checksum computed from Arrow is
the manifest's (segments.checksum)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.archive.parquet_store import to_table
from orchestrator.archive.table_checksum import table_checksum
from orchestrator.archive_model.segments import ArchivedRecord, checksum
from orchestrator.parsing import EventParser
from orchestrator.samples.sample import sample_events
from orchestrator.schema import parse_ddl
from orchestrator.spark.read.arrow import arrow_fields
from orchestrator.spark.read.arrow_events import ArrowEventParser
from orchestrator.spark.read.batch_builder import KAFKA_FIELDS, BatchBuilder
from orchestrator.spark.read.columnar import ColumnarParser

PAGE_VIEWS = "user_id bigint, url string, ts bigint, duration_ms bigint"
NARROW = "n int, flag boolean, s string, tiny tinyint"


def _parsers(ddl: str, non_negative: list[str], pass_tombstones: bool
             ) -> tuple[ColumnarParser, pa.Schema]:
    schema = parse_ddl(ddl)
    columnar = ColumnarParser.for_schema(schema, EventParser(schema, non_negative), non_negative,
                                         pass_tombstones)
    assert columnar is not None
    return columnar, pa.schema([*KAFKA_FIELDS, *arrow_fields(schema)])


def _kafka_path(records: list[ArchivedRecord], ddl: str, non_negative: list[str],
                pass_tombstones: bool, wanted: frozenset[str] | None = None
                ) -> tuple[pa.Table, list[tuple[Any, ...]]]:
    """What the source's read task makes of records read from Kafka."""
    columnar, schema = _parsers(ddl, non_negative, pass_tombstones)
    builder = BatchBuilder(schema, "t", 3, len(schema) - len(KAFKA_FIELDS),
                           pass_tombstones=pass_tombstones, version_id=1, catalog_schema="c",
                           wanted=wanted)
    batches = []
    for at in range(0, len(records), 10_000):
        chunk = [(o, ts, k, v, h) for o, ts, _, k, v, h in records[at:at + 10_000]]
        builder.extend(*columnar.parse(chunk))
        batches.append(builder.flush())
    dead = [d[3:] for d in builder.dead]
    return pa.Table.from_batches(batches, schema=schema), dead


def _archive_path(records: list[ArchivedRecord], ddl: str, non_negative: list[str],
                  pass_tombstones: bool, wanted: frozenset[str] | None = None
                  ) -> tuple[pa.Table, list[tuple[Any, ...]]]:
    columnar, schema = _parsers(ddl, non_negative, pass_tombstones)
    batch, dead = ArrowEventParser(columnar, schema, "t", 3, wanted).parse(to_table(records))
    return pa.Table.from_batches([batch], schema=schema), list(dead)


def _same(records: list[ArchivedRecord], ddl: str = PAGE_VIEWS,
          non_negative: tuple[str, ...] = ("duration_ms",), pass_tombstones: bool = False
          ) -> tuple[pa.Table, list[tuple[Any, ...]]]:
    expected_rows, expected_dead = _kafka_path(records, ddl, list(non_negative), pass_tombstones)
    rows, dead = _archive_path(records, ddl, list(non_negative), pass_tombstones)
    assert rows.to_pylist() == expected_rows.to_pylist()
    assert rows.schema == expected_rows.schema
    assert dead == expected_dead
    return rows, dead


def _records(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None,
             headers: Sequence[Any] | None = None) -> list[ArchivedRecord]:
    return [(100 + i, 1_700_000_000_000 + i, 1, (keys or [b"k"] * len(values))[i], v,
             (headers or [None] * len(values))[i]) for i, v in enumerate(values)]


def test_sample_page_views_give_the_kafka_paths_rows_and_dead_letters() -> None:
    values = [v for _, v in sample_events(30_000, 11, invalid_share=0.05)]
    rows, dead = _same(_records(values))
    assert rows.num_rows + len(dead) == 30_000
    assert len(dead) > 1_000  # every kind of invalid event is in there
    assert {reason.split(":")[0] for *_, reason in dead} >= {"not JSON"}


def test_what_orjson_refuses_and_pyarrow_reads_is_a_dead_letter_with_orjsons_reason() -> None:
    good = b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7}'
    tricky = [
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7,"x":NaN}',
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7,"x":-Infinity}',
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7,"x":1e400}',
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7,"x":"\xed\xa0\x80"}',
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7,"x":' + b"9" * 400 + b"}",
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7,"x":1' + b"0" * 310 + b".5}",
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7}{"user_id":2}',
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7} x}',
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7,"user_id":2}',
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7,"\\u0075rl":"/b"}',
        b'{"user_id":1.0,"url":"/a","ts":5,"duration_ms":7}',
        b'{"user_id":99999999999999999999,"url":"/a","ts":5,"duration_ms":7}',
        b'{"user_id":9223372036854775808,"url":"/a","ts":5,"duration_ms":7}',
        b'{"user_id":1,"url":"/a","ts":5,"duration_ms":-1}',
        b'{"user_id":1,"url":5,"ts":5,"duration_ms":7}',
        b'{"user_id":true,"url":"/a","ts":5,"duration_ms":7}',
        b'{"user_id":1,"url":"/a","ts":5}',
        b'{"user_id":1,"url":null,"ts":5,"duration_ms":7}',
        b' {"user_id":1,"url":"/a","ts":5,"duration_ms":7}',
        b'{"user_id":1,\n"url":"/a","ts":5,"duration_ms":7}',
        b"", None, b"[1]", b"{}", b"{", b"}", b"\xff",
    ]
    for value in tricky:  # one at a time: a value that fails the whole chunk hides none
        _same(_records([good, value, good]))
    rows, dead = _same(_records([v for t in tricky for v in (good, t, good)]))
    assert len(dead) >= 20
    assert rows.column("user_id").to_pylist().count(2) == 1  # the last of duplicate keys wins


def test_narrow_integers_booleans_tombstones_keys_and_headers() -> None:
    values = [b'{"n":1,"flag":true,"s":"x","tiny":127}', b'{"n":2147483648,"flag":true,'
              b'"s":"x","tiny":1}', b'{"n":1,"flag":1,"s":"x","tiny":1}',
              b'{"n":1,"flag":false,"s":"x","tiny":-129}', None,
              b'{"n":-5,"flag":false,"s":"","tiny":0}']
    keys = [b"a", None, b"\xffbad", b"", b"k", b"\xc3\xa9"]
    headers = [None, [("h", b"v")], [], [("h", None), ("g", b"")], None, [("x", b"\x00")]]
    for pass_tombstones in (False, True):
        _same(_records(values, keys, headers), NARROW, ("n",), pass_tombstones)


def test_a_chunk_that_is_mostly_unreadable_gives_the_same_result() -> None:
    _same(_records([b"{nope}"] * 300 + [b'{"user_id":1,"url":"/a","ts":5,"duration_ms":7}']))


_FIELD_VALUES = st.one_of(
    st.integers(-(2 ** 64), 2 ** 64), st.floats(allow_nan=False), st.text(max_size=6),
    st.booleans(), st.none(), st.just([1]), st.just({"a": 1}))


@st.composite
def _values(draw: st.DrawFn) -> bytes | None:
    """JSON events near page views: fields of every type, missing or extra, then maybe
    mangled at the byte level."""
    event: dict[str, Any] = {}
    for name in ("user_id", "url", "ts", "duration_ms", "extra"):
        if draw(st.integers(0, 9)) == 0:
            continue
        if draw(st.integers(0, 3)) == 0:
            event[name] = draw(_FIELD_VALUES)
        else:
            event[name] = {"url": draw(st.sampled_from(["/a", "/b?x=1", "é", "\u0000", "NaN"]))
                           }.get(name, draw(st.integers(0, 2 ** 40)))
    text = json.dumps(event, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    raw = text.encode()
    mangle = draw(st.integers(0, 12))
    if mangle == 0:
        return None
    if mangle == 1:
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from(
            [b"NaN", b"\n", b"}", b"{", b"\xff", b"\xed\xa0\x80", b" ", b"1e5", b'"', b","])) \
            + raw[at:]
    if mangle == 2:
        return raw[:draw(st.integers(0, len(raw)))]
    return raw


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_values(), max_size=6), st.booleans())
def test_property_the_archive_and_kafka_paths_agree(values: list[bytes | None],
                                                   pass_tombstones: bool) -> None:
    _same(_records(values), pass_tombstones=pass_tombstones)


_COLUMNS = [f.name for f in KAFKA_FIELDS] + ["user_id", "url", "ts", "duration_ms"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_values(), max_size=6), st.sets(st.sampled_from(_COLUMNS)))
def test_property_columns_not_wanted_are_null_and_the_others_unchanged(
        values: list[bytes | None], wanted: set[str]) -> None:
    records = _records(values, headers=[[("h", b"v")] if i % 2 else None
                                        for i in range(len(values))])
    for path in (_kafka_path, _archive_path):
        full, full_dead = path(records, PAGE_VIEWS, ["duration_ms"], False)
        pruned, dead = path(records, PAGE_VIEWS, ["duration_ms"], False, frozenset(wanted))
        assert dead == full_dead and pruned.schema == full.schema
        for name in _COLUMNS:
            if name in wanted:
                assert pruned.column(name).to_pylist() == full.column(name).to_pylist()
            elif path is _kafka_path or name != "kafka_offset":  # see ArrowEventParser
                assert pruned.column(name).null_count == pruned.num_rows


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.one_of(st.none(), st.binary(max_size=5)), st.one_of(st.none(), st.binary(max_size=9)),
    st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=3),
                                            st.one_of(st.none(), st.binary(max_size=3))),
                                  max_size=2)),
    st.integers(0, 2)), max_size=30))
def test_property_the_checksum_from_arrow_is_the_manifests(
        fields: list[tuple[bytes | None, bytes | None, Any, int]]) -> None:
    records: list[ArchivedRecord] = [(7 + i, 1_600_000_000_000 - i, kind, key, value, headers)
                                     for i, (key, value, headers, kind) in enumerate(fields)]
    assert table_checksum(to_table(records)) == checksum(records)
    without_headers = [(*r[:5], None) for r in records]
    assert table_checksum(to_table(without_headers)) == checksum(without_headers)
