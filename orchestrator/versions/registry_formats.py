"""What a deploy does for a job whose events are Avro or Protobuf: the schema registry that its
replays read writer schemas from must be configured, and each reader schema named by a registry
subject is fetched and pinned into the version (event_formats.pin_registry_schemas)."""

from __future__ import annotations

from orchestrator.errors import ConfigError
from orchestrator.job_inputs import pin_registry_schemas
from orchestrator.models import JobSpec
from orchestrator.settings import Settings


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
