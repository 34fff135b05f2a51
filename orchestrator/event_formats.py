"""A job's EVENT_FORMAT: how each topic's record values are encoded, and the reader schema that
its events are read with, from which their Spark schema is derived (nothing is declared twice).

- ``"json"`` (the default): EVENT_SCHEMA is the fields, as a DDL string or a dict.
- ``"avro"``: EVENT_SCHEMA is the reader schema: an ``.avsc`` file of the job, a record schema
  written inline, or ``{"subject": ..., "version": N | "latest"}`` of the schema registry,
  fetched and pinned at deploy (``pin_registry_schemas``).
- ``"protobuf"``: EVENT_SCHEMA is ``{"descriptor_set": "<file of the job>.desc", "message":
  "<package.Message>"}``, the set written by ``protoc --include_imports --descriptor_set_out``.

Files are named relative to the job (its directory, or the directory of a job file deployed
alone) and become part of the deployed code, so of its fingerprint. The Avro and Protobuf
libraries are imported only for a job that uses them: the CLI starts without them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

from orchestrator.errors import JobFileError
from orchestrator.models import EVENT_FORMATS, EventFormat, JobSpec, TopicInput
from orchestrator.schema import Struct

# A file of the job by its path relative to the job, or None if there is none.
ReadFile = Callable[[str], bytes | None]
# (subject, version or "latest") -> (the registered schema's text, its version number)
FetchSubject = Callable[[str, int | str], tuple[str, int]]


def declared(kind: Any, raw: Any, what: str, where: str, read: ReadFile
             ) -> tuple[Struct | None, EventFormat]:
    """The fields (None until a registry schema is pinned) and the format of one topic."""
    if kind not in EVENT_FORMATS:
        raise JobFileError(f"{where}: EVENT_FORMAT must be one of "
                           f"{', '.join(map(repr, EVENT_FORMATS))}, not {kind!r}")
    if kind == "avro":
        return _avro(raw, what, where, read)
    if kind == "protobuf":
        return _protobuf(raw, what, where, read)
    if isinstance(raw, str) and raw.endswith((".avsc", ".desc")):
        needed = "avro" if raw.endswith(".avsc") else "protobuf"
        raise JobFileError(f"{where}: {what} names the file {raw!r}, but the events are read as "
                           f"JSON: declare EVENT_FORMAT = {needed!r}")
    return None, EventFormat()


def avro_reader(schema: Any, where: str) -> tuple[str, Struct]:
    """The reader schema's text as pinned (its JSON with sorted keys and no spaces: the same
    schema written differently pins the same reader) and its fields; a schema that is not a
    record, that fastavro refuses, or that holds a type with no Spark type is refused here."""
    from orchestrator.formats.avro_types import event_struct

    struct = event_struct(schema, where)
    return json.dumps(schema, sort_keys=True, separators=(",", ":")), struct


def protobuf_struct(fmt: EventFormat, where: str) -> Struct:
    from orchestrator.formats.protobuf_types import event_struct, message_descriptor

    descriptor = message_descriptor(base64.b64decode(fmt.reader), fmt.message, where)
    return event_struct(descriptor, where)


def pin_registry_schemas(spec: JobSpec, fetch: FetchSubject,
                         checked: Callable[[Struct, TopicInput, str], Struct]) -> JobSpec:
    """The spec with each registry subject's schema fetched, its version pinned and its fields
    derived (``checked`` applies the job's checks to them); the fingerprint then covers the
    pinned schemas, so a redeploy under another registered schema is another code."""
    if not spec.unpinned:
        return spec
    inputs, pinned = [], []
    for declared_input in spec.inputs:
        fmt = declared_input.format
        if fmt.kind != "avro" or fmt.reader:
            inputs.append(declared_input)
            continue
        subject, version = _subject(fmt.source)
        text, number = fetch(subject, version)
        where = f"{spec.path}: {declared_input.topic}'s subject {subject} version {number}"
        reader, fields = avro_reader(_json(text, where), where)
        fmt = replace(fmt, reader=reader, source=f"{subject}@{number}")
        struct = checked(fields, declared_input, where)
        inputs.append(replace(declared_input, schema=struct.ddl(), format=fmt))
        pinned.append(f"{fmt.source}:{reader}")
    digest = hashlib.sha256(f"{spec.fingerprint}\n".encode())
    for line in pinned:
        digest.update(f"{line}\n".encode())
    return replace(spec, inputs=tuple(inputs), fingerprint="sha256:" + digest.hexdigest())


def format_to_json(fmt: EventFormat) -> dict[str, Any] | None:
    if fmt.kind == "json":
        return None
    return {"kind": fmt.kind, "reader": fmt.reader, "message": fmt.message,
            "source": fmt.source}


def format_from_json(doc: Mapping[str, Any] | None) -> EventFormat:
    if doc is None:
        return EventFormat()
    return EventFormat(doc["kind"], doc["reader"], doc["message"], doc["source"])


def _avro(raw: Any, what: str, where: str, read: ReadFile) -> tuple[Struct | None, EventFormat]:
    if isinstance(raw, Mapping) and set(raw) >= {"subject"} and "type" not in raw:
        if not set(raw) <= {"subject", "version"} or not isinstance(raw["subject"], str) \
                or not raw["subject"]:
            raise JobFileError(f'{where}: {what} = {{"subject": ..., "version": ...}} names a '
                               "registry subject (a non-empty string) and its version")
        version = raw.get("version", "latest")
        if version != "latest" and not (type(version) is int and version >= 1):
            raise JobFileError(f"{where}: {what}'s version must be a number from 1 or "
                               f"\"latest\" (pinned at deploy), not {version!r}")
        return None, EventFormat("avro", source=f"{raw['subject']}@{version}")
    if isinstance(raw, str) and raw.endswith(".avsc"):
        text = _file(raw, what, where, read)
        reader, struct = avro_reader(_json(text.decode("utf-8", errors="replace"),
                                           f"{where}: {raw}"), f"{where}: {raw}")
        return struct, EventFormat("avro", reader, source=raw)
    if isinstance(raw, Mapping):
        reader, struct = avro_reader(dict(raw), f"{where}: {what}")
        return struct, EventFormat("avro", reader, source="inline")
    raise JobFileError(f"{where}: with EVENT_FORMAT = 'avro', {what} is an .avsc file of the "
                       'job, a record schema, or {"subject": ..., "version": ...} of the schema '
                       "registry")


def _protobuf(raw: Any, what: str, where: str, read: ReadFile
              ) -> tuple[Struct | None, EventFormat]:
    if not (isinstance(raw, Mapping) and set(raw) == {"descriptor_set", "message"}
            and isinstance(raw["descriptor_set"], str) and isinstance(raw["message"], str)):
        raise JobFileError(f"{where}: with EVENT_FORMAT = 'protobuf', {what} is "
                           '{"descriptor_set": "<file>.desc", "message": "<package.Message>"}; '
                           "write the set with protoc --include_imports --descriptor_set_out")
    path = raw["descriptor_set"]
    fmt = EventFormat("protobuf", base64.b64encode(_file(path, what, where, read)).decode(),
                      raw["message"], source=path)
    return protobuf_struct(fmt, f"{where}: {path}"), fmt


def _file(path: str, what: str, where: str, read: ReadFile) -> bytes:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise JobFileError(f"{where}: {what} names {path!r}: name a file of the job by its path "
                           "relative to the job (no '..', not absolute)")
    content = read(pure.as_posix())
    if content is None:
        raise JobFileError(f"{where}: {what} names {path!r}, which is not beside the job: put "
                           "it there, or fix the name")
    return content


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise JobFileError(f"{where} is not JSON ({exc}): fix it and deploy again") from exc


def _subject(source: str) -> tuple[str, int | str]:
    subject, _, version = source.rpartition("@")
    return subject, int(version) if version.isdigit() else version
