"""The events' Spark schema derived from a job's Avro reader schema, so nothing is declared
twice: records become structs, arrays and maps stay so, a union of null and one type is that
type (nullable), enums and uuids are strings, and the logical types decimal,
timestamp-millis/micros and date keep their meaning.

What has no such type here is refused at deploy, in one line naming the field: bytes and fixed
(but as decimals), unions of two types or more besides null, local timestamps and times of
day (Spark would need types this schema does not have), a record that contains itself, and
two fields whose names differ only in case (Spark resolves names ignoring case)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fastavro

from orchestrator import schema as spark
from orchestrator.errors import JobFileError
from orchestrator.formats.checks import no_spark_type
from orchestrator.schema import DataType, Struct

_PRIMITIVES = {"boolean": "boolean", "int": "int", "long": "bigint", "float": "float",
               "double": "double", "string": "string"}
_TIMESTAMPS = ("timestamp-millis", "timestamp-micros")
_REFUSED_LOGICAL = {
    "local-timestamp-millis": "a local timestamp (no time zone)",
    "local-timestamp-micros": "a local timestamp (no time zone)",
    "time-millis": "a time of day", "time-micros": "a time of day",
    "duration": "a duration",
}
_WHAT_TO_DO = "change its type in the reader schema, or leave the field out of it"


def event_struct(schema: Any, where: str = "the Avro reader schema") -> Struct:
    """The Struct of a record schema (the parsed JSON of an .avsc file)."""
    if not (isinstance(schema, Mapping) and schema.get("type") == "record"):
        raise JobFileError(f"{where} is not a record schema: the events must be Avro records "
                           '({"type": "record", "name": ..., "fields": [...]})')
    return _Mapper({}, where).record(parsed_schema(schema, where), "", ())


def parsed_schema(schema: Any, where: str) -> dict[str, Any]:
    """fastavro's parse of a schema: checked, every name in full (namespace.name)."""
    try:
        parsed = fastavro.parse_schema(schema)
    except (fastavro.schema.SchemaParseException, fastavro.schema.UnknownType, KeyError,
            TypeError, ValueError) as exc:
        raise JobFileError(f"{where} is not a valid Avro schema: {exc}; fix it and deploy "
                           "again") from exc
    assert isinstance(parsed, dict)  # a record, checked before
    return parsed


class _Mapper:
    def __init__(self, named: dict[str, Any], where: str):
        self.named, self.where = named, where

    def refuse(self, path: str, what: str) -> JobFileError:
        return no_spark_type(self.where, path, "record", what, _WHAT_TO_DO)

    def record(self, schema: Mapping[str, Any], path: str, within: tuple[str, ...]) -> Struct:
        name = _full_name(schema)
        if name in within:
            raise self.refuse(path, f"record {name}, which contains itself")
        self.named[name] = schema
        fields: list[tuple[str, DataType]] = []
        seen: dict[str, str] = {}
        for field in schema.get("fields", ()):
            field_name = field["name"]
            field_path = f"{path}.{field_name}" if path else field_name
            if field_name.lower() in seen:
                raise JobFileError(f"{self.where}: fields {seen[field_name.lower()]} and "
                                   f"{field_path} differ only in case, which Spark cannot tell "
                                   "apart: rename one of them")
            seen[field_name.lower()] = field_path
            fields.append((field_name, self.type(field["type"], field_path, (*within, name))))
        if not fields:
            raise self.refuse(path, f"record {name} without fields")
        return Struct(tuple(fields))

    def type(self, schema: Any, path: str, within: tuple[str, ...]) -> DataType:
        if isinstance(schema, list):
            return self.union(schema, path, within)
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return spark.Primitive(_PRIMITIVES[schema])
            if schema in ("bytes", "null"):
                raise self.refuse(path, f"of Avro type {schema}")
            if schema in within:
                raise self.refuse(path, f"record {schema}, which contains itself")
            if schema in self.named:
                return self.type(self.named[schema], path, within)
            raise self.refuse(path, f"of the unknown type {schema!r}")
        kind, logical = schema.get("type"), schema.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            return self.decimal(schema, path)
        if logical in _TIMESTAMPS and kind == "long":
            return spark.Primitive("timestamp")
        if logical == "date" and kind == "int":
            return spark.Primitive("date")
        if logical in _REFUSED_LOGICAL:
            raise self.refuse(path, _REFUSED_LOGICAL[logical])
        if kind == "record":
            return self.record(schema, path, within)
        if kind == "enum":
            self.named[_full_name(schema)] = schema
            return spark.Primitive("string")
        if kind == "array":
            return spark.Array(self.type(schema["items"], f"{path}[]", within))
        if kind == "map":
            return spark.Map(self.type(schema["values"], f"{path}[]", within))
        if kind in ("bytes", "fixed", "null"):
            if kind == "fixed":
                self.named[_full_name(schema)] = schema
            raise self.refuse(path, f"of Avro type {kind}")
        # {"type": "string", "logicalType": "uuid"} and other annotated primitives
        return self.type(kind, path, within)

    def union(self, branches: list[Any], path: str, within: tuple[str, ...]) -> DataType:
        others = [b for b in branches if b != "null"]
        if len(others) != 1:
            shown = " | ".join(b if isinstance(b, str) else str(b.get("type")) for b in branches)
            raise self.refuse(path, f"a union of {shown} (only null and one other type map to "
                              "a Spark type)")
        return self.type(others[0], path, within)

    def decimal(self, schema: Mapping[str, Any], path: str) -> spark.Decimal:
        if schema.get("type") == "fixed":
            self.named[_full_name(schema)] = schema
        precision, scale = schema.get("precision"), schema.get("scale", 0)
        if not isinstance(precision, int) or not 1 <= precision <= spark.MAX_DECIMAL_PRECISION:
            raise self.refuse(path, f"a decimal of precision {precision} (Spark holds 1 to "
                              f"{spark.MAX_DECIMAL_PRECISION})")
        if not isinstance(scale, int) or not 0 <= scale <= precision:
            raise self.refuse(path, f"a decimal({precision}, {scale})")
        return spark.Decimal(precision, scale)


def _full_name(schema: Mapping[str, Any]) -> str:
    name = str(schema.get("name", ""))
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"
