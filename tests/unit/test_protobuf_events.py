"""Protobuf events (#62, pure part): the Spark schema derived from a message of a descriptor
set, and the parser, held to a reference decode (Protobuf's own parse, read back through
json_format) over generated descriptors, values and garbled bytes."""

from __future__ import annotations

import decimal
import math
import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf import (
    descriptor_pb2,
    json_format,
    message_factory,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import JobFileError
from orchestrator.formats import wire
from orchestrator.formats.protobuf_events import ProtobufEventParser
from orchestrator.formats.protobuf_types import event_struct, message_descriptor
from orchestrator.schema import Array, DataType, Decimal, Map, Struct

_SETTINGS = settings(max_examples=200, derandomize=True, database=None)
_IMPORTS = [descriptor_pb2.FileDescriptorProto.FromString(m.DESCRIPTOR.serialized_pb)
            for m in (timestamp_pb2, wrappers_pb2)]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _descriptor_set(*messages: descriptor_pb2.DescriptorProto,
                    enums: tuple[descriptor_pb2.EnumDescriptorProto, ...] = ()) -> bytes:
    file = descriptor_pb2.FileDescriptorProto(
        name="events.proto", package="kappa", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"])
    file.message_type.extend(messages)
    file.enum_type.extend(enums)
    return descriptor_pb2.FileDescriptorSet(file=[*_IMPORTS, file]).SerializeToString()


def _message(name: str, *fields: tuple[str, int, str | None, bool]
             ) -> descriptor_pb2.DescriptorProto:
    """Fields as (name, type, type name or None, repeated)."""
    proto = descriptor_pb2.DescriptorProto(name=name)
    for number, (field, kind, type_name, repeated) in enumerate(fields, start=1):
        proto.field.add(name=field, number=number, type=kind,  # type: ignore[arg-type]
                        label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL,
                        **({"type_name": type_name} if type_name else {}))
    return proto


def _map_entry(name: str, key: int, value: int) -> descriptor_pb2.DescriptorProto:
    entry = _message(name, ("key", key, None, False), ("value", value, None, False))
    entry.options.map_entry = True
    return entry


COLOR = descriptor_pb2.EnumDescriptorProto(name="Color", value=[
    descriptor_pb2.EnumValueDescriptorProto(name="RED", number=0),
    descriptor_pb2.EnumValueDescriptorProto(name="GREEN", number=1)])


def test_the_spark_schema_is_derived_from_the_message() -> None:
    address = _message("Address", ("city", F.TYPE_STRING, None, False))
    view = _message(
        "PageView", ("user_id", F.TYPE_INT64, None, False), ("count", F.TYPE_INT32, None, False),
        ("big", F.TYPE_UINT64, None, False), ("small", F.TYPE_UINT32, None, False),
        ("ok", F.TYPE_BOOL, None, False), ("score", F.TYPE_DOUBLE, None, False),
        ("color", F.TYPE_ENUM, ".kappa.Color", False),
        ("at", F.TYPE_MESSAGE, ".google.protobuf.Timestamp", False),
        ("maybe", F.TYPE_MESSAGE, ".google.protobuf.Int64Value", False),
        ("tags", F.TYPE_STRING, None, True), ("home", F.TYPE_MESSAGE, ".kappa.Address", False),
        ("attrs", F.TYPE_MESSAGE, ".kappa.PageView.AttrsEntry", True))
    view.nested_type.append(_map_entry("AttrsEntry", F.TYPE_STRING, F.TYPE_SINT64))
    descriptor = message_descriptor(_descriptor_set(address, view, enums=(COLOR,)),
                                    "kappa.PageView", "pageview.desc")
    assert event_struct(descriptor, "pageview.desc").ddl() == (
        "`user_id` bigint, `count` int, `big` decimal(20,0), `small` bigint, `ok` boolean, "
        "`score` double, `color` string, `at` timestamp, `maybe` bigint, `tags` array<string>, "
        "`home` struct<`city`:string>, `attrs` map<string,bigint>")


@pytest.mark.parametrize(("field", "message"), [
    (("blob", F.TYPE_BYTES, None, False), "field blob is bytes, which has no Spark type here"),
    (("any", F.TYPE_MESSAGE, ".google.protobuf.BytesValue", False),
     "field any is a google.protobuf.BytesValue"),
    (("self", F.TYPE_MESSAGE, ".kappa.E", False), "field self is message kappa.E, which "
                                                   "contains itself"),
    (("ids", F.TYPE_MESSAGE, ".kappa.E.IdsEntry", True), "field ids is a map whose keys are "
                                                          "not strings"),
])
def test_a_type_without_a_spark_type_is_refused_naming_its_field(
        field: tuple[str, int, str | None, bool], message: str) -> None:
    proto = _message("E", ("ok", F.TYPE_INT64, None, False), field)
    proto.nested_type.append(_map_entry("IdsEntry", F.TYPE_INT64, F.TYPE_STRING))
    with pytest.raises(JobFileError, match="^e.desc: " + message.replace("(", r"\(")):
        event_struct(message_descriptor(_descriptor_set(proto), "kappa.E", "e.desc"), "e.desc")


def test_an_unknown_message_and_a_file_that_is_no_descriptor_set_are_refused() -> None:
    with pytest.raises(JobFileError, match=r"has no message 'kappa\.Nope': it has .*kappa\.E"):
        message_descriptor(_descriptor_set(_message("E", ("a", F.TYPE_INT64, None, False))),
                           "kappa.Nope", "e.desc")
    with pytest.raises(JobFileError, match="is not a usable descriptor set"):
        message_descriptor(b"\xff\xfenot protobuf", "kappa.E", "e.desc")


# --- generated messages against Protobuf's own decode ---------------------------------------

_SCALARS: list[tuple[int, st.SearchStrategy[Any]]] = [
    (F.TYPE_INT32, st.integers(-(2**31), 2**31 - 1)),
    (F.TYPE_INT64, st.integers(-(2**63), 2**63 - 1)),
    (F.TYPE_SINT64, st.integers(-(2**63), 2**63 - 1)),
    (F.TYPE_UINT32, st.integers(0, 2**32 - 1)), (F.TYPE_UINT64, st.integers(0, 2**64 - 1)),
    (F.TYPE_FIXED64, st.integers(0, 2**64 - 1)), (F.TYPE_BOOL, st.booleans()),
    (F.TYPE_STRING, st.text(max_size=6)), (F.TYPE_DOUBLE, st.floats(allow_nan=False)),
    (F.TYPE_FLOAT, st.floats(width=32, allow_nan=False)),
    (F.TYPE_ENUM, st.sampled_from([0, 1, 7])),  # 7: a number a newer writer added
]
_TIMESTAMPS = st.tuples(st.integers(-62135596800, 253402300799), st.integers(0, 999_999_999))


@st.composite
def _messages(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, str, Any]]]:
    """A descriptor set of kappa.E and a strategy per field: (name, kind, values)."""
    inner = _message("Inner", ("n", F.TYPE_INT64, None, False),
                     ("s", F.TYPE_STRING, None, True))
    fields: list[tuple[str, int, str | None, bool]] = []
    plan: list[tuple[str, str, Any]] = []
    for i in range(draw(st.integers(1, 6))):
        name, choice = f"f{i}", draw(st.integers(0, 6))
        if choice <= 2:
            kind, values = draw(st.sampled_from(_SCALARS))
            repeated = choice == 2
            fields.append((name, kind, ".kappa.Color" if kind == F.TYPE_ENUM else None,
                           repeated))
            plan.append((name, "repeated" if repeated else "scalar",
                         st.lists(values, max_size=3) if repeated else values))
        elif choice == 3:
            fields.append((name, F.TYPE_MESSAGE, ".google.protobuf.Timestamp", False))
            plan.append((name, "timestamp", st.none() | _TIMESTAMPS))
        elif choice == 4:
            fields.append((name, F.TYPE_MESSAGE, ".google.protobuf.Int64Value", False))
            plan.append((name, "wrapper", st.none() | st.integers(-(2**63), 2**63 - 1)))
        elif choice == 5:
            fields.append((name, F.TYPE_MESSAGE, ".kappa.Inner", False))
            plan.append((name, "inner", st.none() | st.tuples(
                st.integers(-(2**63), 2**63 - 1), st.lists(st.text(max_size=3), max_size=2))))
        else:
            fields.append((name, F.TYPE_MESSAGE, f".kappa.E.M{i}Entry", True))
            plan.append((name, "map", st.dictionaries(st.text(max_size=3),
                                                      st.integers(-(2**31), 2**31 - 1),
                                                      max_size=3)))
    proto = _message("E", *fields)
    proto.nested_type.extend(_map_entry(f"M{i}Entry", F.TYPE_STRING, F.TYPE_INT32)
                             for i, (_, kind, _, _) in enumerate(fields)
                             if kind == F.TYPE_MESSAGE and fields[i][2] == f".kappa.E.M{i}Entry")
    return _descriptor_set(inner, proto, enums=(COLOR,)), plan


def _filled(cls: Any, plan: list[tuple[str, str, Any]], values: list[Any]) -> Any:
    message = cls()
    for (name, kind, _), v in zip(plan, values, strict=True):
        if kind == "scalar":
            setattr(message, name, v)
        elif kind == "repeated":
            getattr(message, name).extend(v)
        elif kind == "map":
            getattr(message, name).update(v)
        elif v is not None and kind == "timestamp":
            getattr(message, name).seconds, getattr(message, name).nanos = v
        elif v is not None and kind == "wrapper":
            getattr(message, name).value = v
        elif v is not None:
            getattr(message, name).n = v[0]
            getattr(message, name).s.extend(v[1])
    return message


def _reference(cls: Any, body: bytes, parser: ProtobufEventParser) -> tuple[Any, ...] | None:
    """Protobuf's own decode, read back through json_format into the declared types."""
    try:
        message = cls.FromString(body)
    except Exception:
        return None
    shown = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                      always_print_fields_with_no_presence=True)
    return tuple(_declared(shown.get(name), t) for name, t in parser.schema.fields)


def _declared(v: Any, t: DataType) -> Any:
    if v is None:
        return None
    if isinstance(t, Array):
        return [_declared(x, t.element) for x in v]
    if isinstance(t, Map):
        return {k: _declared(x, t.value) for k, x in v.items()}
    if isinstance(t, Struct):
        return {name: _declared(v.get(name), ft) for name, ft in t.fields}
    if isinstance(t, Decimal):
        return decimal.Decimal(v)
    name = t.ddl()
    if name == "timestamp":
        whole, _, fraction = v.rstrip("Z").partition(".")
        moment = datetime.fromisoformat(whole).replace(tzinfo=UTC)
        return moment + timedelta(microseconds=int((fraction + "000000")[:6]))
    if name in ("bigint", "int"):
        return int(v)
    if name in ("double", "float"):
        v = {"Infinity": math.inf, "-Infinity": -math.inf}.get(v, v)
        # json_format writes a float's shortest text as a float32: the nearest float32 is it.
        return struct.unpack("<f", struct.pack("<f", v))[0] if name == "float" else v
    return str(v) if name == "string" and type(v) is int else v


@_SETTINGS
@given(st.data(), _messages())
def test_messages_read_as_protobufs_own_decode_reads_them(
        data: st.DataObject, generated: tuple[bytes, list[tuple[str, str, Any]]]) -> None:
    descriptors, plan = generated
    parser = ProtobufEventParser(descriptors, "kappa.E", {5: "known"}.get)
    cls = message_factory.GetMessageClass(message_descriptor(descriptors, "kappa.E", "-"))
    message = _filled(cls, plan, [data.draw(values) for _, _, values in plan])
    body = message.SerializeToString()
    indexes = data.draw(st.sampled_from([(0,), (1,), (0, 2)]))
    values, error = parser.parse(wire.frame(5, body, indexes))
    assert error is None
    assert values == _reference(cls, body, parser)
    # Garbled: cut short, or a byte changed.
    cut = data.draw(st.integers(0, len(body)))
    garbled = data.draw(st.sampled_from([body[:cut], body[:cut] + bytes(
        [data.draw(st.integers(0, 255))]) + body[cut + 1:]]))
    expected = _reference(cls, garbled, parser)
    values, error = parser.parse(wire.frame(5, garbled, (0,)))
    assert (values, error is None) == (expected, expected is not None), error


def test_each_dead_letter_says_why() -> None:
    descriptors = _descriptor_set(_message("E", ("n", F.TYPE_INT64, None, False),
                                           ("at", F.TYPE_MESSAGE, ".google.protobuf.Timestamp",
                                            False)))
    parser = ProtobufEventParser(descriptors, "kappa.E", {5: "known"}.get, non_negative=["n"])
    cls = message_factory.GetMessageClass(message_descriptor(descriptors, "kappa.E", "-"))
    good = cls(n=3).SerializeToString()
    assert parser.parse(wire.frame(5, good, (0,))) == ((3, None), None)
    assert parser.parse(wire.frame(6, good, (0,))) == (
        None, "unknown schema id 6: the schema registry has no schema with that id")
    assert parser.parse(wire.frame(5, cls(n=-1).SerializeToString(), (0,))) == (
        None, "field n is negative")
    assert parser.parse(wire.frame(5, b"\xff\xff\xff", (0,)))[1].startswith(
        "not Protobuf of message kappa.E (writer schema 5): ")
    assert parser.parse(wire.frame(5, b"", None))[1] == (
        "truncated message indexes: the value ends inside a varint")
    late = cls(n=1)
    late.at.seconds = 2**40
    assert parser.parse(wire.frame(5, late.SerializeToString(), (0,)))[1].startswith(
        "a timestamp of message kappa.E is out of range (writer schema 5)")
    moment = cls(n=1)
    moment.at.seconds, moment.at.nanos = 86_400, 1_500
    assert parser.parse(wire.frame(5, moment.SerializeToString(), (0,))) == (
        (1, _EPOCH + timedelta(days=1, microseconds=1)), None)
    assert parser.writer_ids == {5}


def test_enums_read_as_names_and_a_newer_writers_number_as_its_text() -> None:
    descriptors = _descriptor_set(_message("E", ("c", F.TYPE_ENUM, ".kappa.Color", False),
                                           ("r", F.TYPE_ENUM, ".kappa.Color", True)),
                                  enums=(COLOR,))
    cls = message_factory.GetMessageClass(message_descriptor(descriptors, "kappa.E", "-"))
    parser = ProtobufEventParser(descriptors, "kappa.E", {1: "known"}.get)
    written = cls(c=7, r=[1, 0, 7]).SerializeToString()
    assert parser.parse(wire.frame(1, written, (0,))) == (("7", ["GREEN", "RED", "7"]), None)


def test_a_oneofs_members_are_null_but_the_one_set() -> None:
    proto = _message("E", ("n", F.TYPE_INT64, None, False), ("s", F.TYPE_STRING, None, False),
                     ("plain", F.TYPE_INT64, None, False))
    proto.oneof_decl.add(name="either")
    proto.field[0].oneof_index = proto.field[1].oneof_index = 0
    descriptors = _descriptor_set(proto)
    cls = message_factory.GetMessageClass(message_descriptor(descriptors, "kappa.E", "-"))
    parser = ProtobufEventParser(descriptors, "kappa.E", {1: "known"}.get)
    assert parser.parse(wire.frame(1, cls(s="").SerializeToString(), (0,))) == (
        (None, "", 0), None)
    assert parser.parse(wire.frame(1, cls(n=0).SerializeToString(), (0,))) == ((0, None, 0), None)
