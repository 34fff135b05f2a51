"""Arrow types for a declared event schema (executor side: pyarrow, no pyspark).

The types are the ones Spark maps the same DDL to, so the batches the source yields need no
cast; ``EventParser``'s values (datetimes in UTC, ``Decimal``, dicts for structs and maps) are
what ``pyarrow.array`` takes for them.
"""

from __future__ import annotations

import pyarrow as pa

from orchestrator.schema import Array, DataType, Decimal, Map, Primitive, Struct

_PRIMITIVES = {
    "bigint": pa.int64(),
    "int": pa.int32(),
    "smallint": pa.int16(),
    "tinyint": pa.int8(),
    "double": pa.float64(),
    "float": pa.float32(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),  # Spark's TimestampType: microseconds, UTC
    "date": pa.date32(),
}


def arrow_type(t: DataType) -> pa.DataType:
    if isinstance(t, Primitive):
        return _PRIMITIVES[t.name]
    if isinstance(t, Decimal):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, Array):
        return pa.list_(arrow_type(t.element))
    if isinstance(t, Map):
        return pa.map_(pa.string(), arrow_type(t.value))
    return pa.struct(arrow_fields(t))


def arrow_fields(struct: Struct) -> list[pa.Field]:
    return [pa.field(name, arrow_type(t)) for name, t in struct.fields]
