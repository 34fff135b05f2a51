"""Whole-chunk validation of flat events: the source's hot path without per-field Python work.

``EventParser.parse`` checks one record at a time, one field at a time. For a schema of plain
integers, strings and booleans the same checks can run over a whole chunk of records at once:
one column per field, pulled out of the parsed objects and checked with ``map``/``min``/``max``,
which loop in C. Only records that fail a check go through ``EventParser.parse``, so their
errors are its own word for word, and every record lands where the per-record path puts it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_, itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from orchestrator.parsing import EventParser
from orchestrator.schema import INTEGER_BITS, Primitive, Struct

if TYPE_CHECKING:
    from orchestrator.kafka.reader import RecordWithHeaders

__all__ = ["ColumnarParser", "Parsed"]

Headers = list[tuple[str, bytes | None]]
# (offset, timestamp_ms, key, value, error) of a record that becomes a dead letter
DeadRecord = tuple[int, int, bytes | None, bytes | None, str | None]
_KINDS: dict[str, type] = {"string": str, "boolean": bool, **dict.fromkeys(INTEGER_BITS, int)}

# What a record that is not a JSON object reads as: every field is missing (None), so it fails
# every column's type check; a passed tombstone then needs no values of its own.
_NOTHING: dict[str, Any] = {}


class Parsed(NamedTuple):
    """One chunk: the columns of the rows it keeps, in record order, and its dead letters."""

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    headers: list[Headers | None]
    fields: list[list[Any]]
    dead: list[DeadRecord]


@dataclass(frozen=True)
class _Column:
    """One top-level field: the one Python type its values have, and integer bounds."""

    name: str
    kind: type
    bounds: tuple[int, int] | None  # inclusive; the low end is 0 for a NON_NEGATIVE field

    def invalid_rows(self, values: list[Any]) -> list[int]:
        """Indices of the values this field rejects (a missing field reads as None: rejected).

        Each check is one C-level pass over the column; only a column that fails one pays a
        second pass, to find its (few) bad rows.
        """
        types = list(map(type, values))
        bad: list[int] = []
        if types.count(self.kind) != len(types):
            # type(v) is int rejects booleans, as EventParser does (bool subclasses int).
            bad = _positions(list(map(is_, types, repeat(self.kind))), False)
        if self.bounds is None or len(bad) == len(values):
            return bad
        lo, hi = self.bounds
        if bad:  # give each wrongly typed value an in-range stand-in, so min and max compare
            values = values.copy()
            for i in bad:
                values[i] = lo
        if min(values) < lo:
            bad += _positions(list(map(lo.__le__, values)), False)
        if max(values) > hi:
            bad += _positions(list(map(hi.__ge__, values)), False)
        return bad


class ColumnarParser:
    """Parses chunks of records as ``EventParser`` would, a column at a time.

    Column checks pay off when few records fail them: each one that does is parsed again,
    record by record. A chunk that follows a mostly invalid one (a producer sending the wrong
    type, say) is parsed record by record from the start; either way the result is the same.
    """

    # Above this share of dead letters the column checks cost more than they save: on the
    # sample events (pageview_counts v1) the two ways break even near 1/6 of them.
    PER_RECORD_ABOVE = 0.125

    def __init__(self, columns: tuple[_Column, ...], parser: EventParser, pass_tombstones: bool):
        self._columns = columns
        self._parser = parser
        self._pass_tombstones = pass_tombstones
        self._per_record = False  # the previous chunk was mostly dead letters

    @property
    def columns(self) -> tuple[_Column, ...]:
        return self._columns

    @classmethod
    def for_schema(cls, schema: Struct, parser: EventParser, non_negative: Sequence[str],
                   pass_tombstones: bool) -> ColumnarParser | None:
        """The parser for a flat schema of integers, strings and booleans; None for any other.

        Other types (floats, decimals, dates, nested values) convert or recurse per value,
        which is what this path avoids: their records keep going through ``parser.parse``.
        """
        if parser.fields != schema.names:
            return None
        columns = []
        for name, t in schema.fields:
            if not isinstance(t, Primitive) or t.name not in _KINDS:
                return None
            bounds = None
            if t.name in INTEGER_BITS:
                half = 2 ** (INTEGER_BITS[t.name] - 1)
                bounds = (0 if name in non_negative else -half, half - 1)
            columns.append(_Column(name, _KINDS[t.name], bounds))
        if not set(non_negative) <= {c.name for c in columns if c.bounds is not None}:
            return None  # a path EventParser reads differently (it rejects these anyway)
        return cls(tuple(columns), parser, pass_tombstones)

    def parse(self, records: Sequence[RecordWithHeaders]) -> Parsed:
        """The kept rows and dead letters of ``records``, exactly as the per-record path."""
        if not records:
            return Parsed([], [], [], [], [[] for _ in self._columns], [])
        parsed = (self._each if self._per_record else self._by_column)(records)
        self._per_record = len(parsed.dead) > self.PER_RECORD_ABOVE * len(records)
        return parsed

    def _by_column(self, records: Sequence[RecordWithHeaders]) -> Parsed:
        """Every field checked over the whole chunk; only flagged rows are parsed one by one."""
        offsets, timestamps, keys, headers = (
            list(map(itemgetter(i), records)) for i in (0, 1, 2, 4))
        events = _load_all(map(itemgetter(3), records))
        bad = _not_objects(events)
        fields = []
        for column in self._columns:
            field = list(map(dict.get, events, repeat(column.name)))
            bad.update(column.invalid_rows(field))
            fields.append(field)
        if not bad:
            return Parsed(offsets, timestamps, keys, headers, fields, [])
        dropped, dead = self._judge(sorted(bad), records, fields)
        without = _dropper(dropped, len(records))
        return Parsed(without(offsets), without(timestamps), without(keys), without(headers),
                      [without(f) for f in fields], dead)

    def _judge(self, rows: list[int], records: Sequence[RecordWithHeaders],
               fields: list[list[Any]]) -> tuple[list[int], list[DeadRecord]]:
        """The rows to drop, and their dead letters, from ``EventParser.parse`` of ``rows``.

        ``parse`` gives the error each dead letter carries; it also decides each of these rows,
        so the outcome is its own even for a row the column checks flagged by mistake.
        """
        dropped: list[int] = []
        dead: list[DeadRecord] = []
        for i in rows:
            offset, timestamp_ms, key, value, _ = records[i]
            parsed, error = self._parse(value)
            if parsed is None:
                dropped.append(i)
                dead.append((offset, timestamp_ms, key, value, error))
            else:
                for field, v in zip(fields, parsed, strict=True):
                    field[i] = v
        return dropped, dead

    def _each(self, records: Sequence[RecordWithHeaders]) -> Parsed:
        """The chunk parsed record by record, as BatchBuilder.add takes them."""
        kept: list[RecordWithHeaders] = []
        rows: list[tuple[Any, ...]] = []
        dead: list[DeadRecord] = []
        parse = self._parser.parse  # not self._parse: one call less for each record
        for record in records:
            parsed, error = parse(record[3])
            if parsed is None:
                if record[3] is not None or not self._pass_tombstones:
                    dead.append((record[0], record[1], record[2], record[3], error))
                    continue
                parsed = (None,) * len(self._columns)
            kept.append(record)
            rows.append(parsed)
        offsets, timestamps, keys, headers = (
            list(map(itemgetter(i), kept)) for i in (0, 1, 2, 4))
        fields = [list(f) for f in zip(*rows, strict=True)] if rows else [
            [] for _ in self._columns]
        return Parsed(offsets, timestamps, keys, headers, fields, dead)

    def _parse(self, value: bytes | None) -> tuple[tuple[Any, ...] | None, str | None]:
        """EventParser.parse, with a tombstone a row of nulls when the job passes them."""
        parsed, error = self._parser.parse(value)
        if parsed is None and value is None and self._pass_tombstones:
            return (None,) * len(self._columns), None
        return parsed, error


def _load_all(values: Iterable[bytes | None]) -> list[Any]:
    """Each value's JSON, or None where it is not JSON (a tombstone is not either)."""
    # A plain loop: its cost is noise beside orjson's, and a failure costs nothing extra.
    out: list[Any] = []
    append, loads = out.append, orjson.loads
    for value in values:
        try:
            append(loads(value))  # type: ignore[arg-type]  # None raises, as not JSON
        except (ValueError, RecursionError):  # what EventParser.parse catches
            append(None)
    return out


def _not_objects(events: list[Any]) -> set[int]:
    """Indices of the events that are not JSON objects; each becomes ``_NOTHING`` in place."""
    types = list(map(type, events))
    if types.count(dict) == len(types):
        return set()
    rows = _positions(list(map(is_, types, repeat(dict))), False)
    for i in rows:
        events[i] = _NOTHING
    return set(rows)


def _positions(flags: list[bool], flag: bool) -> list[int]:
    """The indices where ``flags`` holds ``flag``, ascending."""
    found: list[int] = []
    i = -1
    for _ in range(flags.count(flag)):
        i = flags.index(flag, i + 1)  # scans in C up to the next one
        found.append(i)
    return found


def _dropper(rows: list[int], n: int) -> Callable[[list[Any]], list[Any]]:
    """A function that takes the ``rows`` (ascending) out of a list of ``n`` values."""
    if len(rows) * 32 < n:
        def without(values: list[Any]) -> list[Any]:
            # A few rows: copying the runs between them, each in one go, beats a pass over all.
            out: list[Any] = []
            start = 0
            for i in rows:
                out += values[start:i]
                start = i + 1
            out += values[start:]
            return out
        return without
    keep = [True] * n
    for i in rows:
        keep[i] = False
    return lambda values: list(compress(values, keep))
