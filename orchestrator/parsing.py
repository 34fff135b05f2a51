"""Validation of raw events against a job's declared event schema (pure Python, hot path)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

_INT64 = (-(2**63), 2**63 - 1)


def _is_long(v: Any) -> bool:
    return type(v) is int and _INT64[0] <= v <= _INT64[1]


def _is_double(v: Any) -> bool:
    return type(v) is float or _is_long(v)


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "long": _is_long,
    "string": lambda v: type(v) is str,
    "double": _is_double,
    "boolean": lambda v: type(v) is bool,
}


class EventParser:
    """Turns a record value into the declared fields, or says why the record is invalid."""

    def __init__(self, schema: Sequence[tuple[str, str]], non_negative: Sequence[str] = ()):
        self.fields = tuple(name for name, _ in schema)
        self._checks = tuple((name, kind, _CHECKS[kind]) for name, kind in schema)
        self._non_negative = tuple(non_negative)

    def parse(self, value: bytes | None) -> tuple[tuple[Any, ...] | None, str | None]:
        """Return (values in schema order, None) or (None, error)."""
        if value is None:
            return None, "empty value (tombstone)"
        try:
            event = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            return None, f"not JSON: {str(exc)[:120]}"
        if type(event) is not dict:
            return None, f"not a JSON object: {type(event).__name__}"
        out = []
        for name, kind, check in self._checks:
            if name not in event:
                return None, f"missing field {name}"
            v = event[name]
            if not check(v):
                return None, f"field {name} is not a {kind}: {type(v).__name__}"
            out.append(float(v) if kind == "double" else v)
        for name in self._non_negative:
            if event[name] < 0:
                return None, f"field {name} is negative"
        return tuple(out), None
