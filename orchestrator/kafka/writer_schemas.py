"""The schema registry's writer schemas for a process that may never need them: the client
(and its import, a third of a second) comes with the first lookup."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.kafka.registry_endpoint import RegistryEndpoint

if TYPE_CHECKING:
    from orchestrator.kafka.registry import SchemaRegistry


class LazyRegistry:
    """The registry's writer schemas by id (record_parsers.WriterSchemas), its client made on
    the first lookup and shared by the process: a pass or a read task that meets only JSON
    never imports the client."""

    def __init__(self, endpoint: RegistryEndpoint):
        self.endpoint = endpoint

    def avro_schema(self, schema_id: int) -> dict[str, Any] | None:
        return self._client().avro_schema(schema_id)

    def known(self, schema_id: int) -> bool | None:
        return self._client().known(schema_id)

    def _client(self) -> SchemaRegistry:
        from orchestrator.kafka.registry import shared_registry

        return shared_registry(self.endpoint)


def writer_schemas(endpoint: RegistryEndpoint | None) -> LazyRegistry | None:
    return None if endpoint is None else LazyRegistry(endpoint)
