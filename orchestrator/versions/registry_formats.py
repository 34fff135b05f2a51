"""What a deploy does for a job whose events are Avro or Protobuf: the schema registry that its
replays read writer schemas from must be configured; each reader schema named by a registry
subject is fetched and pinned into the version (event_formats.pin_registry_schemas); and an
Avro reader schema must read every writer schema that a sample of the log's records carry
(formats/avro_compat.py), unless the deploy allows those records to become dead letters."""

from __future__ import annotations

import json
from collections.abc import Callable

from orchestrator.errors import ConfigError, JobFileError
from orchestrator.job_inputs import pin_registry_schemas
from orchestrator.models import JobSpec
from orchestrator.settings import Settings

# topic -> {writer schema id: (partition, offset) of a record that carries it}
WriterSample = Callable[[str], dict[int, tuple[int, int]]]


def registry_formats(spec: JobSpec, settings: Settings) -> JobSpec:
    """The spec as deployed: unchanged for JSON, with its registry subjects pinned else."""
    framed = sorted({(i.format.kind, i.topic) for i in spec.inputs if i.format.kind != "json"})
    if not framed:
        return spec
    endpoint = settings.schema_registry
    if endpoint is None:
        kind, topic = framed[0]
        raise ConfigError(f"{spec.path}: the events of {topic} are {kind} in the schema "
                          "registry's wire format, and no schema registry is configured: set "
                          "schema_registry_url (KAPPA_SCHEMA_REGISTRY_URL), then deploy again")
    if not spec.unpinned:
        return spec
    from orchestrator.kafka.registry import SchemaRegistry

    return pin_registry_schemas(spec, SchemaRegistry.at(endpoint).subject_schema)


def refuse_unreadable_writers(spec: JobSpec, settings: Settings, sample: WriterSample) -> None:
    """One line naming the writer schema (its id, subject and version, a record of it) and the
    field, for the first Avro writer schema in the log that the reader schema cannot read."""
    endpoint = settings.schema_registry
    avro = [i for i in spec.inputs if i.format.kind == "avro"]
    if endpoint is None or not avro:
        return
    from orchestrator.formats.avro_compat import unreadable
    from orchestrator.kafka.registry import SchemaRegistry

    registry = SchemaRegistry.at(endpoint)
    for topic_input in avro:
        reader = json.loads(topic_input.format.reader)
        for schema_id, (partition, offset) in sorted(sample(topic_input.topic).items()):
            writer = registry.avro_schema(schema_id)
            reason = None if writer is None else unreadable(writer, reader)
            if reason is None:  # an unknown id is each record's dead letter, not the reader's
                continue
            subject = f"{topic_input.topic}-value"
            version = registry.version_of(subject, schema_id)
            named = f"{subject} version {version}" if version else "under no subject"
            raise JobFileError(
                f"{spec.path}: the reader schema of {topic_input.topic} cannot read the records "
                f"written with schema id {schema_id} ({named}; one at partition {partition} "
                f"offset {offset}): {reason}. Give the field a default in the reader schema, "
                "or deploy with --allow-incompatible to send those records to the dead-letter "
                "table")
