"""The events' Spark schema derived from a Protobuf message: a descriptor set (``protoc
--include_imports --descriptor_set_out``) and the message's full name.

Messages become structs, repeated fields arrays, maps with string keys maps; enums are their
value's name; 64-bit unsigned integers are decimal(20,0) (they pass a bigint's range), 32-bit
ones bigints; ``google.protobuf.Timestamp`` is a timestamp and the wrapper types their value,
null when absent. A field with presence (a message, proto3 ``optional``, a oneof's member)
is null when it is not set; one without is its default, as Protobuf reads it.

Refused at deploy, naming the field: bytes (no binary type here), groups, maps whose keys are
not strings, other well-known types (Any, Struct, Duration, ...), and a message that contains
itself."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from orchestrator import schema as spark
from orchestrator.errors import JobFileError
from orchestrator.formats.checks import no_spark_type
from orchestrator.schema import DataType, Struct

_F = FieldDescriptor
SCALARS: dict[int, DataType] = {
    _F.TYPE_DOUBLE: spark.Primitive("double"), _F.TYPE_FLOAT: spark.Primitive("float"),
    _F.TYPE_INT64: spark.Primitive("bigint"), _F.TYPE_SINT64: spark.Primitive("bigint"),
    _F.TYPE_SFIXED64: spark.Primitive("bigint"), _F.TYPE_UINT64: spark.Decimal(20, 0),
    _F.TYPE_FIXED64: spark.Decimal(20, 0), _F.TYPE_INT32: spark.Primitive("int"),
    _F.TYPE_SINT32: spark.Primitive("int"), _F.TYPE_SFIXED32: spark.Primitive("int"),
    _F.TYPE_UINT32: spark.Primitive("bigint"), _F.TYPE_FIXED32: spark.Primitive("bigint"),
    _F.TYPE_BOOL: spark.Primitive("boolean"), _F.TYPE_STRING: spark.Primitive("string"),
    _F.TYPE_ENUM: spark.Primitive("string"),
}
TIMESTAMP = "google.protobuf.Timestamp"
WRAPPERS = {f"google.protobuf.{name}Value": kind for name, kind in (
    ("Double", "double"), ("Float", "float"), ("Int64", "bigint"), ("Int32", "int"),
    ("UInt32", "bigint"), ("Bool", "boolean"), ("String", "string"))}
_WHAT_TO_DO = "change its type in the message, or read another message"


def message_descriptor(descriptor_set: bytes, message: str, where: str) -> Descriptor:
    """``message``'s descriptor from a serialized FileDescriptorSet."""
    pool = descriptor_pool.DescriptorPool()
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file
        for file in files:
            pool.Add(file)
        return pool.FindMessageTypeByName(message)
    except KeyError:
        names = [f"{f.package}.{m.name}" if f.package else m.name
                 for f in files for m in f.message_type]
        raise JobFileError(f"{where} has no message {message!r}: it has {', '.join(names)}; "
                           "name one with its package") from None
    except Exception as exc:  # not a descriptor set, or one whose imports are missing
        raise JobFileError(f"{where} is not a usable descriptor set ({exc}): write it with "
                           "protoc --include_imports --descriptor_set_out") from None


def event_struct(message: Descriptor, where: str) -> Struct:
    return _struct(message, "", (), where)


def _struct(message: Descriptor, path: str, within: tuple[str, ...], where: str) -> Struct:
    if message.full_name in within:
        raise _refuse(where, path, f"message {message.full_name}, which contains itself")
    fields: list[tuple[str, DataType]] = []
    for field in message.fields:
        field_path = f"{path}.{field.name}" if path else field.name
        fields.append((field.name, _type(field, field_path, (*within, message.full_name),
                                         where)))
    if not fields:
        raise _refuse(where, path, f"message {message.full_name} without fields")
    return Struct(tuple(fields))


def _type(field: FieldDescriptor, path: str, within: tuple[str, ...], where: str) -> DataType:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        if key.type != _F.TYPE_STRING:
            raise _refuse(where, path, "a map whose keys are not strings")
        return spark.Map(_single(value, f"{path}[]", within, where))
    single = _single(field, f"{path}[]" if field.is_repeated else path, within, where)
    return spark.Array(single) if field.is_repeated else single


def _single(field: FieldDescriptor, path: str, within: tuple[str, ...], where: str) -> DataType:
    if field.type in SCALARS:
        return SCALARS[field.type]
    if field.type == _F.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name == TIMESTAMP:
            return spark.Primitive("timestamp")
        if name in WRAPPERS:
            return spark.Primitive(WRAPPERS[name])
        if name.startswith("google.protobuf."):
            raise _refuse(where, path, f"a {name}")
        return _struct(field.message_type, path, within, where)
    kind = "bytes" if field.type == _F.TYPE_BYTES else "a group"
    raise _refuse(where, path, kind)


def _refuse(where: str, path: str, what: Any) -> JobFileError:
    return no_spark_type(where, path, "message", what, _WHAT_TO_DO)
