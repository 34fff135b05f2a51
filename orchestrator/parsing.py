"""Validation of raw events against a job's declared event schema (pure Python, hot path).

The schema is compiled once into one (check, label, convert) triple per top-level field: a flat
schema of numbers, strings and booleans then costs one predicate call per field, as it always
did. Nested values are checked by converters that raise ``_Invalid``; the path to the bad value
(``address.city``, ``tags[2]``, ``attrs['k']``) is assembled only while that error unwinds.
"""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from datetime import UTC, date, datetime
from typing import Any

import orjson

from orchestrator.formats.checks import decimal_fitter, first_negative, non_negative_paths
from orchestrator.schema import (
    INTEGER_BITS,
    Array,
    DataType,
    Decimal,
    Map,
    Primitive,
    Struct,
    check_non_negative,
    from_flat,
)

Check = Callable[[Any], bool]
Convert = Callable[[Any], Any]

_INT64 = (-(2**63), 2**63 - 1)
# Messages name types as Spark's JSON schemas do, so a bigint "is not a long" as it always was.
_LABELS = {"bigint": "long", "int": "integer", "smallint": "short", "tinyint": "byte"}
_DECIMAL_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_TIMESTAMP = re.compile(
    r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d(?::\d\d(?:\.\d{1,9})?)?(?:[Zz]|[+-]\d\d(?::?\d\d)?)?",
    re.ASCII,
)
_DATE = re.compile(r"\d{4}-\d\d-\d\d", re.ASCII)


class _Invalid(Exception):
    """A bad value inside a field; each enclosing container adds its step to ``path``."""

    def __init__(self, suffix: str, prefix: str = "field "):
        super().__init__(suffix)
        self.prefix, self.suffix = prefix, suffix
        self.path: list[str] = []  # innermost step first

    def message(self, field: str) -> str:
        return f"{self.prefix}{field}{''.join(reversed(self.path))}{self.suffix}"


def _is_long(v: Any) -> bool:
    return type(v) is int and _INT64[0] <= v <= _INT64[1]


def _is_double(v: Any) -> bool:
    return type(v) is float or _is_long(v)


def _is_exact_double(v: Any) -> bool:
    return type(v) is float or type(v) is decimal.Decimal or _is_long(v)


def _is_str(v: Any) -> bool:
    return type(v) is str


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _is_list(v: Any) -> bool:
    return type(v) is list


def _is_dict(v: Any) -> bool:
    return type(v) is dict


def _is_decimal_input(v: Any) -> bool:
    return type(v) is int or type(v) is decimal.Decimal or type(v) is str


def _json_type(v: Any) -> str:
    # Under the exact parse a JSON float arrives as a Decimal: name it as the JSON has it.
    return "float" if type(v) is decimal.Decimal else type(v).__name__


def _show(v: str) -> str:
    return repr(v if len(v) <= 40 else v[:40] + "...")


def _integer(bits: int) -> Check:
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return lambda v: type(v) is int and lo <= v <= hi


def _timestamp(v: str) -> datetime:
    if _TIMESTAMP.fullmatch(v):
        try:
            t = datetime.fromisoformat(v.upper())  # fromisoformat wants T and Z in capitals
            return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
        except (ValueError, OverflowError):
            pass
    raise _Invalid(f" is not a timestamp: {_show(v)}")


def _date(v: str) -> date:
    if _DATE.fullmatch(v):
        try:
            return date.fromisoformat(v)
        except ValueError:
            pass
    raise _Invalid(f" is not a date: {_show(v)}")


def _decimal(t: Decimal) -> Convert:
    fit = decimal_fitter(t)

    def convert(v: Any) -> decimal.Decimal:
        if type(v) is str and _DECIMAL_TEXT.fullmatch(v) is None:
            raise _Invalid(f" is not a {t.ddl()}: {_show(v)}")
        d: decimal.Decimal | None = fit(v)
        if d is None:
            shown = v if type(v) is str else str(v)
            raise _Invalid(f" does not fit {t.ddl()}: {shown[:40]}")
        return d
    return convert


def _array(element: Convert) -> Convert:
    def convert(v: list[Any]) -> list[Any]:
        out: list[Any] = []
        try:
            for x in v:
                out.append(element(x))
        except _Invalid as exc:
            exc.path.append(f"[{len(out)}]")  # every element before the bad one is in out
            raise
        return out
    return convert


def _map(value: Convert) -> Convert:
    def convert(v: dict[str, Any]) -> dict[str, Any]:
        out = {}
        try:
            for k, x in v.items():
                out[k] = value(x)
        except _Invalid as exc:
            exc.path.append(f"[{k!r}]")
            raise
        return out
    return convert


def _struct(t: Struct, exact: bool) -> Convert:
    fields = tuple((name, _converter(ft, exact)) for name, ft in t.fields)

    def convert(v: dict[str, Any]) -> dict[str, Any]:
        out = {}
        try:
            for name, field in fields:
                if name not in v:
                    raise _Invalid("", prefix="missing field ")
                out[name] = field(v[name])
        except _Invalid as exc:
            exc.path.append("." + name)
            raise
        return out
    return convert


def _compile(t: DataType, exact: bool) -> tuple[Check, str, Convert | None]:
    """(check of the JSON value's type, "a long" for messages, conversion or None)."""
    if isinstance(t, Primitive):
        name = t.name
        if name == "bigint":
            return _is_long, "a long", None
        if name in INTEGER_BITS:
            label = _LABELS[name]
            return _integer(INTEGER_BITS[name]), ("an " if name == "int" else "a ") + label, None
        if name in ("double", "float"):
            return (_is_exact_double if exact else _is_double), f"a {name}", float
        if name == "string":
            return _is_str, "a string", None
        if name == "boolean":
            return _is_bool, "a boolean", None
        if name == "timestamp":
            return _is_str, "a timestamp", _timestamp
        return _is_str, "a date", _date
    if isinstance(t, Decimal):
        return _is_decimal_input, f"a {t.ddl()}", _decimal(t)
    if isinstance(t, Array):
        return _is_list, "an array", _array(_converter(t.element, exact))
    if isinstance(t, Map):
        return _is_dict, "a map", _map(_converter(t.value, exact))
    return _is_dict, "a struct", _struct(t, exact)


def _converter(t: DataType, exact: bool) -> Convert:
    check, label, post = _compile(t, exact)

    def convert(v: Any) -> Any:
        if not check(v):
            raise _Invalid(f" is not {label}: {_json_type(v)}")
        return v if post is None else post(v)
    return convert


def _has_decimal(t: DataType) -> bool:
    if isinstance(t, Decimal):
        return True
    if isinstance(t, Array):
        return _has_decimal(t.element)
    if isinstance(t, Map):
        return _has_decimal(t.value)
    if isinstance(t, Struct):
        return any(_has_decimal(ft) for _, ft in t.fields)
    return False


_EXACT_JSON = json.JSONDecoder(parse_float=decimal.Decimal)


def _loads_exact(value: bytes) -> Any:
    # orjson first: it decides what is JSON (UTF-8, no NaN, no lone surrogates) exactly as for
    # every other schema. The second parse keeps each float's digits for the decimal fields.
    orjson.loads(value)
    return _EXACT_JSON.decode(value.decode())


class EventParser:
    """Turns a record value into the declared fields, or says why the record is invalid."""

    # JSON carries no writer schema: a decoded JSON segment records none.
    writer_ids: AbstractSet[int] = frozenset()

    def __init__(self, schema: Struct | Sequence[tuple[str, str]],
                 non_negative: Sequence[str] = ()):
        if not isinstance(schema, Struct):
            schema = from_flat(dict(schema))
        check_non_negative(schema, non_negative)
        exact = _has_decimal(schema)
        self.schema = schema
        self.fields = schema.names
        self._loads: Callable[[bytes], Any] = _loads_exact if exact else orjson.loads
        self._checks = tuple(
            (name, *_compile(t, exact)) for name, t in schema.fields
        )
        self._non_negative = non_negative_paths(self.fields, non_negative)

    def parse(self, value: bytes | None) -> tuple[tuple[Any, ...] | None, str | None]:
        """Return (values in schema order, None) or (None, error)."""
        if value is None:
            return None, "empty value (tombstone)"
        try:
            event = self._loads(value)
        except (ValueError, RecursionError) as exc:  # orjson.JSONDecodeError is a ValueError
            return None, f"not JSON: {str(exc)[:120]}"
        if type(event) is not dict:
            return None, f"not a JSON object: {_json_type(event)}"
        out = []
        try:
            for name, check, label, convert in self._checks:
                if name not in event:
                    return None, f"missing field {name}"
                v = event[name]
                if not check(v):
                    return None, f"field {name} is not {label}: {_json_type(v)}"
                out.append(v if convert is None else convert(v))
        except _Invalid as exc:
            return None, exc.message(name)
        negative = first_negative(out, self._non_negative)
        if negative is not None:
            return None, negative
        return tuple(out), None
