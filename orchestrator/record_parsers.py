"""The per-record parser of a topic's format: each turns a record value into the declared
fields in order, or gives the reason the record is a dead letter, and lists the fields."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from orchestrator.errors import ConfigError
from orchestrator.models import EventFormat
from orchestrator.schema import Struct


class WriterSchemas(Protocol):
    """The schema registry's lookups by writer schema id (kafka/registry.SchemaRegistry)."""

    def avro_schema(self, schema_id: int) -> Mapping[str, Any] | None: ...

    def known(self, schema_id: int) -> bool | None: ...


class RecordParser(Protocol):
    fields: tuple[str, ...]

    @property
    def writer_ids(self) -> AbstractSet[int]:
        """The writer schema ids of the records parsed so far."""

    def parse(self, value: bytes | None) -> tuple[tuple[Any, ...] | None, str | None]: ...


def record_parser(schema: Struct, non_negative: Sequence[str], fmt: EventFormat,
                  writer_schemas: WriterSchemas | None) -> RecordParser:
    """``writer_schemas``: the schema registry's lookup, needed by Avro and Protobuf only."""
    if fmt.kind == "json":
        from orchestrator.parsing import EventParser

        return EventParser(schema, non_negative)
    if writer_schemas is None:
        raise ConfigError(f"the events are {fmt.kind} in the schema registry's wire format, and "
                          "no schema registry is configured: set schema_registry_url "
                          "(KAPPA_SCHEMA_REGISTRY_URL)")
    if fmt.kind == "avro":
        from orchestrator.formats.avro_events import AvroEventParser

        return AvroEventParser(json.loads(fmt.reader), writer_schemas.avro_schema, non_negative)
    from orchestrator.formats.protobuf_events import ProtobufEventParser

    return ProtobufEventParser(base64.b64decode(fmt.reader), fmt.message,
                               lambda schema_id: writer_schemas.known(schema_id) or None,
                               non_negative)
