"""Protobuf events in the schema registry's wire format, read into the declared fields as
``parsing.EventParser`` reads JSON: ``parse(value)`` gives the values in the schema's order, or
the reason the record is a dead letter.

Protobuf resolves by field number, so every record is read with the job's own message,
whichever version of it the writer had: fields the reader lacks are skipped, fields the writer
lacked read as absent. The writer schema's id is still checked against the registry (an id it
does not know makes a dead letter) and recorded. The message indexes after the id are read
past, not followed: the job names the message it reads."""

from __future__ import annotations

import decimal
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from orchestrator.formats import wire
from orchestrator.formats.checks import first_negative, non_negative_paths
from orchestrator.formats.protobuf_types import (
    TIMESTAMP,
    WRAPPERS,
    event_struct,
    message_descriptor,
)
from orchestrator.schema import check_non_negative

KnownIds = Callable[[int], object | None]
Read = Callable[[Any], Any]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_F = FieldDescriptor
_UNSIGNED_64 = (_F.TYPE_UINT64, _F.TYPE_FIXED64)
_SHOWN = 120


class ProtobufEventParser:
    """Turns a record value into the declared fields, or says why the record is invalid."""

    def __init__(self, descriptor_set: bytes, message: str, known_ids: KnownIds,
                 non_negative: Sequence[str] = (), where: str = "the descriptor set"):
        descriptor = message_descriptor(descriptor_set, message, where)
        self.schema = event_struct(descriptor, where)
        check_non_negative(self.schema, non_negative)
        self.fields = self.schema.names
        self._message = message_factory.GetMessageClass(descriptor)
        self._name = descriptor.full_name
        self._reads = tuple(_field_reader(f) for f in descriptor.fields)
        self._known_ids = known_ids
        self._known: dict[int, bool] = {}
        self.writer_ids: set[int] = set()
        self._non_negative = non_negative_paths(self.fields, non_negative)

    def parse(self, value: bytes | None) -> tuple[tuple[Any, ...] | None, str | None]:
        """Return (values in schema order, None) or (None, error)."""
        found = wire.read_frame(value, indexed=True)
        if isinstance(found, str):
            return None, found
        schema_id, body = found
        if schema_id not in self._known:
            self._known[schema_id] = self._known_ids(schema_id) is not None
        if not self._known[schema_id]:
            return None, (f"unknown schema id {schema_id}: the schema registry has no schema "
                          "with that id")
        self.writer_ids.add(schema_id)
        try:
            message = self._message.FromString(body)
        except Exception as exc:  # DecodeError, and whatever garbled bytes raise besides
            return None, (f"not Protobuf of message {self._name} (writer schema {schema_id}): "
                          f"{str(exc)[:_SHOWN]}")
        try:
            out = tuple(read(message) for read in self._reads)
        except (OverflowError, ValueError) as exc:  # a Timestamp past what Spark holds
            return None, (f"a timestamp of message {self._name} is out of range (writer schema "
                          f"{schema_id}): {str(exc)[:_SHOWN]}")
        negative = first_negative(out, self._non_negative)
        return (None, negative) if negative else (out, None)


def _field_reader(field: FieldDescriptor) -> Read:
    """What reads ``field`` from a parsed message, as the declared type holds it."""
    name = field.name
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        value = _value_reader(entry.fields_by_name["value"])
        return lambda m: {k: value(v) for k, v in getattr(m, name).items()}
    single = _value_reader(field)
    if field.is_repeated:
        return lambda m: [single(v) for v in getattr(m, name)]
    if field.has_presence:
        return lambda m: single(getattr(m, name)) if m.HasField(name) else None
    return lambda m: single(getattr(m, name))


def _value_reader(field: FieldDescriptor) -> Read:
    """One value of ``field`` (an element, for a repeated one)."""
    if field.type == _F.TYPE_ENUM:
        names = {v.number: v.name for v in field.enum_type.values}
        # An open enum keeps numbers that a newer writer added: shown as the number.
        return lambda v: names.get(v, str(v))
    if field.type in _UNSIGNED_64:
        return decimal.Decimal
    if field.type != _F.TYPE_MESSAGE:
        return lambda v: v
    kind: Descriptor = field.message_type
    if kind.full_name == TIMESTAMP:
        return lambda v: _EPOCH + timedelta(seconds=v.seconds, microseconds=v.nanos // 1000)
    if kind.full_name in WRAPPERS:
        return lambda v: v.value
    reads = tuple((f.name, _field_reader(f)) for f in kind.fields)
    return lambda v: {name: read(v) for name, read in reads}
