"""Archived records parsed from Arrow to Arrow: the archive's read path without a Python object
per record (executor side).

A segment's values are joined into one buffer and read by pyarrow's JSON reader into the
declared columns; the checks that ``ColumnarParser`` makes on Python values run as Arrow
kernels. pyarrow's reader is not orjson, so nothing is taken on its word alone:

- a value goes to ``ColumnarParser`` (the Kafka path's own code, record by record where it
  must) unless it is plain: a non-empty JSON object text, valid UTF-8, on one line, without the
  tokens that pyarrow reads but orjson refuses (``NaN``, ``Infinity``, numbers of 20 digits or
  with an exponent, nesting as deep as orjson's limit), and with every declared field present
  and of its type;
- a value the reader fails on is sent there too, and any failure that the reader does not pin
  to one value (or a count of rows that is not one per value) sends the whole chunk.

So every row and every dead letter is the Kafka path's, reason for reason; the property test in
tests/unit/test_arrow_events.py holds the two paths to that.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from orchestrator.spark.read.batch_builder import (
    KAFKA_FIELDS,
    built_or_null,
    kafka_arrays,
    utf8_keys,
)
from orchestrator.spark.read.columnar import ColumnarParser, DeadRecord

__all__ = ["ArrowEventParser"]

# What orjson refuses and pyarrow reads, or may read otherwise: NaN and Infinity, exponents
# (1e400 overflows a double for orjson), 20 digits (overflows both 64-bit integers and, at 309,
# a double) and line breaks (one value must stay one line of the joined buffer).
_SUSPECT = r"NaN|Inf|\d[eE]|\d{20}|[\r\n]"
# What a field's value must not start with (or, for an integer, go on with): another type.
_OTHER_TYPE = {int: r"(?:[^-0-9]|-?\d+\.)", str: '[^"]', bool: "[^tf]"}
_ERROR_ROW = re.compile(r" in row (\d+)$")
_DEEP = 1000  # brackets from which a value may be deeper than orjson reads (1,024 levels)
# Above this share of values that the reader fails on, the chunk goes to ColumnarParser whole:
# each such value costs a second read of the values before it.
_MOST_FAILURES = 0.05


class _Unpinned(Exception):
    """pyarrow failed on the chunk without naming one value: ColumnarParser takes it."""


class ArrowEventParser:
    def __init__(self, columnar: ColumnarParser, schema: pa.Schema, topic: str, partition: int,
                 wanted: frozenset[str] | None = None):
        self._columnar = columnar
        # The columns built, the others null (None: all); the offsets always, for they order
        # the merge with the records parsed one by one.
        self._wanted = None if wanted is None else wanted | {"kafka_offset"}
        self._schema = schema  # the batches' schema: KAFKA_FIELDS, then the declared fields
        self._fields = schema.names[len(KAFKA_FIELDS):]
        self._topic, self._partition = topic, partition
        # Integers are read as 64-bit and checked against their width afterwards: a value out
        # of a narrower type's range is the column check's to reject, not the reader's.
        self._read_schema = pa.schema([
            pa.field(f.name, pa.int64() if pa.types.is_integer(f.type) else f.type)
            for f in schema][len(KAFKA_FIELDS):])
        # A field of another JSON type, or an integer written with a fraction, fails the
        # reader on the whole chunk (the latter names no row): such values go to ColumnarParser
        # up front. A key that only reads as the field's name once unescaped slips through,
        # and costs a second read; the same key inside another field's object is suspect too.
        self._suspect = "|".join([_SUSPECT, *(
            f'"{re.escape(c.name)}"\\s*:\\s*{_OTHER_TYPE[c.kind]}' for c in columnar.columns)])
        self._parse_options = pj.ParseOptions(explicit_schema=self._read_schema,
                                              unexpected_field_behavior="ignore")

    def parse(self, chunk: pa.Table) -> tuple[pa.RecordBatch, list[DeadRecord]]:
        """The rows and dead letters of ``chunk`` (archived records, parquet_store.SCHEMA)."""
        values = chunk.column("value").combine_chunks()
        plain = np.flatnonzero(~_suspect(values, self._suspect))
        try:
            parsed, failed = self._read(values.take(plain))
        except _Unpinned:
            return self._by_columnar(chunk, np.arange(chunk.num_rows))
        keep = np.ones(len(plain), bool)
        keep[failed] = False
        keep_read = np.flatnonzero(keep)
        checked = self._valid(parsed)
        good = keep_read[checked]
        rows = plain[good]
        others = np.setdiff1d(np.arange(chunk.num_rows), rows, assume_unique=True)
        fields = parsed.take(pa.array(np.flatnonzero(checked)))
        batch = self._batch(chunk.take(pa.array(rows)), fields)
        if not len(others):
            return batch, []
        extra, dead = self._by_columnar(chunk, others)
        merged = pa.Table.from_batches([batch, extra]).sort_by("kafka_offset")
        return merged.combine_chunks().to_batches()[0] if merged.num_rows else batch, dead

    def _read(self, values: pa.BinaryArray) -> tuple[pa.Table, list[int]]:
        """The declared fields of each value, and the indices of the values the reader failed on
        (absent from the table)."""
        tables: list[pa.Table] = []
        failed: list[int] = []
        start, n = 0, len(values)
        while start < n:
            try:
                tables.append(self._read_all(values[start:]))
                break
            except _Unpinned as exc:
                row = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
                if row is None or len(failed) >= _MOST_FAILURES * n:
                    raise _Unpinned() from None
                if row:
                    # The values before the failure, read again: each must give one row, so
                    # that the failure is the value at ``row`` and none before it.
                    tables.append(self._read_all(values[start:start + row], pinned=False))
                failed.append(start + row)
                start += row + 1
        if not tables:
            return self._read_schema.empty_table(), failed
        return pa.concat_tables(tables), failed

    def _read_all(self, values: pa.BinaryArray, pinned: bool = True) -> pa.Table:
        """One row per value, or _Unpinned (with the failing value's index where pyarrow names
        one and ``pinned``)."""
        if not len(values):
            return self._read_schema.empty_table()
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()),
                                                         values), b"\n")[0].as_buffer()
        options = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, joined.size + 1))
        try:
            table = pj.read_json(pa.BufferReader(joined), read_options=options,
                                 parse_options=self._parse_options)
        except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
            found = _ERROR_ROW.search(str(exc)) if pinned else None
            raise _Unpinned(int(found.group(1)) if found else None) from None
        if table.num_rows != len(values):
            raise _Unpinned()
        return table

    def _valid(self, parsed: pa.Table) -> np.ndarray:
        """Which rows pass every column check (a missing or null field fails it)."""
        ok = np.ones(parsed.num_rows, bool)
        for name, column in zip(parsed.column_names, self._columnar.columns, strict=True):
            data = parsed.column(name)
            ok &= ~np.asarray(data.is_null().to_numpy(zero_copy_only=False))
            if column.bounds is not None:
                lo, hi = column.bounds
                inside = pc.and_(pc.greater_equal(data, lo), pc.less_equal(data, hi))
                ok &= np.asarray(inside.fill_null(False).to_numpy(zero_copy_only=False))
        return ok

    def _batch(self, records: pa.Table, fields: pa.Table) -> pa.RecordBatch:
        """The rows of ``records`` with their parsed ``fields``, in the batches' schema."""
        arrays = _archived_kafka_arrays(self._topic, self._partition, records, self._wanted)
        n = records.num_rows
        for i, name in enumerate(self._fields):
            kind = self._schema.field(name).type
            arrays.append(built_or_null(name, self._wanted, n, kind,
                                        partial(_combined, fields.column(i), kind)))
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def _by_columnar(self, chunk: pa.Table, rows: np.ndarray
                     ) -> tuple[pa.RecordBatch, list[DeadRecord]]:
        """The records at ``rows`` as the Kafka path parses them, with their dead letters."""
        from orchestrator.archive.parquet_store import as_records

        parsed = self._columnar.parse(as_records(chunk.take(pa.array(rows))))
        arrays: list[Any] = kafka_arrays(self._topic, self._partition, parsed.offsets,
                                         parsed.timestamps, parsed.keys, parsed.headers,
                                         self._wanted)
        n = len(parsed.offsets)
        for values, name in zip(parsed.fields, self._fields, strict=True):
            kind = self._schema.field(name).type
            arrays.append(built_or_null(name, self._wanted, n, kind,
                                        partial(pa.array, values, kind)))
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema), parsed.dead


def _archived_kafka_arrays(topic: str, partition: int, records: pa.Table,
                           wanted: frozenset[str] | None) -> list[pa.Array]:
    """The Kafka metadata columns of archived records, as ``kafka_arrays`` builds them."""
    n = records.num_rows

    def key_strings() -> pa.Array:
        keys = records.column("key").combine_chunks()
        try:
            return keys.cast(pa.string())
        except pa.ArrowInvalid:  # a key that is not UTF-8: replacement characters, as from Kafka
            return utf8_keys(keys.to_pylist())

    builds: tuple[Callable[[], pa.Array], ...] = (
        lambda: pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                               pa.array([topic])).cast(pa.string()),
        lambda: pa.array(np.full(n, partition, np.int32)),
        lambda: records.column("offset").combine_chunks(),
        lambda: records.column("timestamp_ms").combine_chunks()
        .cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
        key_strings,
        lambda: _headers(records.column("headers").combine_chunks()),
    )
    return [built_or_null(field.name, wanted, n, field.type, build)
            for field, build in zip(KAFKA_FIELDS, builds, strict=True)]


def _combined(column: pa.ChunkedArray, kind: pa.DataType) -> pa.Array:
    return column.combine_chunks().cast(kind)


def _headers(headers: pa.ListArray) -> pa.Array:
    """Archived headers [(name, value)] as the batches' [(key, value)]; none or an empty list
    is null, as from Kafka."""
    kind = KAFKA_FIELDS[5].type
    if headers.null_count == len(headers):
        return pa.nulls(len(headers), kind)
    empty = pc.or_kleene(headers.is_null(), pc.equal(pc.list_value_length(headers), 0))
    pairs = headers.flatten()
    renamed = pa.StructArray.from_arrays([pairs.field("name"), pairs.field("value")],
                                         fields=list(kind.value_type))
    offsets = pc.subtract(headers.offsets, headers.offsets[0])
    return pa.ListArray.from_arrays(offsets, renamed, type=kind,
                                    mask=empty.fill_null(True))


def _suspect(values: pa.BinaryArray, pattern: str) -> np.ndarray:
    """Values that pyarrow's reader is not trusted with (see the module's docstring)."""
    n = len(values)
    if not n:
        return np.zeros(0, bool)
    lengths = np.asarray(pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False),
                         np.int64)
    bad: np.ndarray = lengths == 0  # a tombstone or an empty value
    _, offsets, data = values.buffers()
    bounds = np.frombuffer(offsets, np.int32)[values.offset:values.offset + n + 1]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(1, np.uint8)
    filled = ~bad
    first = np.zeros(n, np.uint8)
    last = np.zeros(n, np.uint8)
    first[filled] = raw[bounds[:-1][filled]]
    last[filled] = raw[bounds[1:][filled] - 1]
    bad |= (first != ord("{")) | (last != ord("}"))
    bad |= np.asarray(pc.match_substring_regex(values, pattern).fill_null(True).to_numpy(
        zero_copy_only=False), bool)
    # orjson refuses JSON nested deeper than it recurses; pyarrow reads it. A value holds at
    # least as many brackets as its depth, so one with fewer cannot be too deep.
    brackets = np.zeros(n, np.int64)
    for bracket in ("[", "{"):
        brackets += np.asarray(pc.count_substring(values, bracket).fill_null(0).to_numpy(
            zero_copy_only=False), np.int64)
    bad |= brackets >= _DEEP
    try:
        values.cast(pa.string())
    except pa.ArrowInvalid:  # rare: find the values that are not UTF-8, one by one
        bad |= np.array([v is not None and not _utf8(v) for v in values.to_pylist()], bool)
    return bad


def _utf8(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True
