"""Avro events in the schema registry's wire format, read into the declared fields as
``parsing.EventParser`` reads JSON: ``parse(value)`` gives the values in the schema's order, or
the reason the record is a dead letter.

Each record names the schema it was written with (its writer schema's id). That schema is
fetched once per id, and the record is resolved from it to the job's reader schema, as Avro's
schema resolution says: fields added with defaults are filled, removed fields skipped, types
promoted. A log kept for years is read by today's code so, whichever schema wrote each record.

The writer schemas come from ``writer_schemas(id)``: the schema, or None when the registry has
no such id (a dead letter). A registry that cannot be reached raises from there, and that
propagates: an outage stalls the read, it never makes dead letters."""

from __future__ import annotations

import decimal
import io
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import fastavro
from fastavro.read import SchemaResolutionError

from orchestrator.formats import wire
from orchestrator.formats.avro_types import event_struct, parsed_schema
from orchestrator.formats.checks import decimal_fitter, first_negative, non_negative_paths
from orchestrator.schema import Array, DataType, Decimal, Map, Struct, check_non_negative

WriterSchemas = Callable[[int], Mapping[str, Any] | None]
Convert = Callable[[Any], Any]

_SHOWN = 120  # characters of a decoder's message kept in a dead letter's reason


class _Unfit(Exception):
    """A decoded value that the declared type cannot hold; the message is the reason."""


class AvroEventParser:
    """Turns a record value into the declared fields, or says why the record is invalid."""

    def __init__(self, reader_schema: Mapping[str, Any], writer_schemas: WriterSchemas,
                 non_negative: Sequence[str] = ()):
        self.schema = event_struct(reader_schema)
        check_non_negative(self.schema, non_negative)
        self.fields = self.schema.names
        self._reader = parsed_schema(reader_schema, "the Avro reader schema")
        self._writer_schemas = writer_schemas
        self._writers: dict[int, dict[str, Any] | None] = {}
        self.writer_ids: set[int] = set()  # the writer schemas met, for the decoded segments
        uuids = _has_uuid(self._reader)
        self._converts = tuple((name, _converter(t, name, uuids)) for name, t in
                               self.schema.fields)
        self._non_negative = non_negative_paths(self.fields, non_negative)

    def parse(self, value: bytes | None) -> tuple[tuple[Any, ...] | None, str | None]:
        """Return (values in schema order, None) or (None, error)."""
        found = wire.read_frame(value, indexed=False)
        if isinstance(found, str):
            return None, found
        schema_id, body = found
        writer = self._writer(schema_id)
        if writer is None:
            return None, (f"unknown schema id {schema_id}: the schema registry has no schema "
                          "with that id")
        stream = io.BytesIO(body)
        try:
            record: Any = fastavro.schemaless_reader(stream, writer, self._reader)
        except SchemaResolutionError as exc:
            return None, (f"writer schema {schema_id} cannot be read with the reader schema: "
                          f"{str(exc)[:_SHOWN]}")
        except Exception as exc:  # whatever garbled bytes make the decoder raise
            return None, (f"not Avro of writer schema {schema_id}: {type(exc).__name__}: "
                          f"{str(exc)[:_SHOWN]}")
        left = len(body) - stream.tell()
        if left:
            return None, (f"not Avro of writer schema {schema_id}: {left} bytes left over "
                          "after the record")
        try:
            out = tuple(record[name] if convert is None else convert(record[name])
                        for name, convert in self._converts)
        except _Unfit as exc:
            return None, str(exc)
        negative = first_negative(out, self._non_negative)
        return (None, negative) if negative else (out, None)

    def _writer(self, schema_id: int) -> dict[str, Any] | None:
        if schema_id not in self._writers:
            found = self._writer_schemas(schema_id)
            self._writers[schema_id] = None if found is None else parsed_schema(
                found, f"writer schema {schema_id}")
        writer = self._writers[schema_id]
        if writer is not None:
            self.writer_ids.add(schema_id)
        return writer


def _converter(t: DataType, path: str, uuids: bool) -> Convert | None:
    """What turns fastavro's value into the declared type's (None: nothing to do)."""
    if isinstance(t, Decimal):
        return _decimal(t, path)
    if isinstance(t, Array):
        element = _converter(t.element, f"{path}[]", uuids)
        return None if element is None else _nullable(lambda v: [element(x) for x in v])
    if isinstance(t, Map):
        value = _converter(t.value, f"{path}[]", uuids)
        return None if value is None else _nullable(
            lambda v: {k: value(x) for k, x in v.items()})
    if isinstance(t, Struct):
        fields = tuple((name, _converter(ft, f"{path}.{name}", uuids)) for name, ft in t.fields)
        if all(convert is None for _, convert in fields):
            return None
        return _nullable(lambda v: {name: v[name] if convert is None else convert(v[name])
                                    for name, convert in fields})
    if uuids and t.ddl() == "string":
        return lambda v: str(v) if type(v) is uuid.UUID else v
    return None


def _nullable(convert: Convert) -> Convert:
    return lambda v: None if v is None else convert(v)


def _decimal(t: Decimal, path: str) -> Convert:
    fit = decimal_fitter(t)

    def convert(v: decimal.Decimal | None) -> decimal.Decimal | None:
        if v is None:
            return None
        d: decimal.Decimal | None = fit(v)
        if d is None:
            raise _Unfit(f"field {path} does not fit {t.ddl()}: {str(v)[:40]}")
        return d
    return convert


def _has_uuid(schema: Any) -> bool:
    if isinstance(schema, list):
        return any(_has_uuid(s) for s in schema)
    if not isinstance(schema, dict):
        return False
    if schema.get("logicalType") == "uuid":
        return True
    # a field's type, a record's fields, an array's items, a map's values
    return any(_has_uuid(schema.get(key)) for key in ("type", "fields", "items", "values"))
