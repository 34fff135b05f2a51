"""The schema registry, through ``confluent_kafka.schema_registry``'s client (its HTTP,
retries and cache; no client of our own): writer schemas by id for the Avro parser.

What the registry answers decides what a record becomes. An id it does not know (HTTP 404) is
the record's fault: a dead letter. A registry that cannot be reached, or answers 5xx or 429, is
an outage (RegistryUnavailableError): the read stalls and is tried again; it never makes dead
letters. A 401 or 403 is a configuration error (RegistryAuthError) that no retry mends.
Credentials go to the client's configuration only; no message quotes them."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from orchestrator.errors import JobFileError, RegistryAuthError, RegistryUnavailableError
from orchestrator.kafka.registry_endpoint import RegistryEndpoint

_NOT_FOUND = 404
_REFUSED = (401, 403)


class SchemaRegistry:
    def __init__(self, url: str, *, user_info: str | None = None, token: str | None = None,
                 ca_location: str | None = None, timeout_s: float = 10.0, retries: int = 2):
        self.url = shown_url(url)
        conf: dict[str, Any] = {"url": url, "timeout": timeout_s, "max.retries": retries,
                                "retries.wait.ms": 200, "retries.max.wait.ms": 2000}
        if user_info is not None:
            conf["basic.auth.user.info"] = user_info
        if token is not None:
            conf.update({"bearer.auth.credentials.source": "STATIC_TOKEN",
                         "bearer.auth.token": token, "bearer.auth.logical.cluster": "-"})
        if ca_location is not None:
            conf["ssl.ca.location"] = ca_location
        self._client = SchemaRegistryClient(conf)

    @classmethod
    def at(cls, endpoint: RegistryEndpoint) -> SchemaRegistry:
        return cls(endpoint.url, user_info=endpoint.user_info, token=endpoint.token,
                   ca_location=endpoint.ca_location)

    def subject_schema(self, subject: str, version: int | str) -> tuple[str, int]:
        """The Avro schema text registered under ``subject`` at ``version`` (a number or
        "latest"), and that version's number: what a deploy pins."""
        what = f"subject {subject} version {version}"
        registered = self._call(lambda v: self._client.get_version(subject, v), version, what)
        if registered is None:
            raise JobFileError(f"the schema registry at {self.url} has no {what}: register it, "
                               "or name a registered one in EVENT_SCHEMA")
        schema = registered.schema
        if (schema.schema_type or "AVRO") != "AVRO":
            raise JobFileError(f"the schema registry's {what} is a {schema.schema_type} schema, "
                               "not Avro: name an Avro subject, or declare the job's format")
        return str(schema.schema_str), int(registered.version)

    def version_of(self, subject: str, schema_id: int) -> int | None:
        """The version under ``subject`` of the schema with ``schema_id``; None where the
        registry has no such schema, or not under that subject."""
        what = f"schema id {schema_id} under subject {subject}"
        schema = self._call(self._client.get_schema, schema_id, what)
        if schema is None:
            return None
        registered = self._call(lambda s: self._client.lookup_schema(subject, s), schema, what)
        return None if registered is None else int(registered.version)

    def known(self, schema_id: int) -> bool:
        """Whether the registry has a schema of that id (of any type)."""
        return self._call(self._client.get_schema, schema_id, f"schema id {schema_id}") \
            is not None

    def avro_schema(self, schema_id: int) -> dict[str, Any] | None:
        """The Avro schema of ``schema_id`` as parsed JSON; None if the registry has no such
        id or it is not an Avro schema."""
        schema = self._call(self._client.get_schema, schema_id, f"schema id {schema_id}")
        if schema is None or (schema.schema_type or "AVRO") != "AVRO":
            return None
        found: dict[str, Any] = json.loads(schema.schema_str or "null")
        return found

    def _call(self, method: Any, argument: Any, what: str) -> Any:
        try:
            return method(argument)
        except SchemaRegistryError as exc:
            status = exc.http_status_code
            if status == _NOT_FOUND:
                return None
            if status in _REFUSED:
                raise RegistryAuthError(
                    f"the schema registry at {self.url} refused the credentials for {what} "
                    f"(HTTP {status}: {exc.error_message}): set KAPPA_SCHEMA_REGISTRY_USER_INFO "
                    "or KAPPA_SCHEMA_REGISTRY_TOKEN, then restart the version") from None
            raise RegistryUnavailableError(
                f"the schema registry at {self.url} answered HTTP {status} for {what} "
                f"({exc.error_message}); the read resumes once it answers") from None
        except Exception as exc:  # the client's HTTP library: refused, reset, timed out
            raise RegistryUnavailableError(
                f"the schema registry at {self.url} cannot be reached for {what} "
                f"({type(exc).__name__}); the read resumes once it answers") from None


@lru_cache(maxsize=8)
def shared_registry(endpoint: RegistryEndpoint) -> SchemaRegistry:
    """One client per registry in a process: a reused Python worker asks for each writer
    schema once, whatever the number of its read tasks."""
    return SchemaRegistry.at(endpoint)


def shown_url(url: str) -> str:
    """The URL without any user:password in it, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))


def avro_serializer(endpoint: RegistryEndpoint, topic: str, schemas: Sequence[Mapping[str, Any]]
                    ) -> Callable[[dict[str, Any], int], bytes]:
    """The registry client's own AvroSerializer for ``topic``'s values, one per schema version
    (registered under ``<topic>-value`` on first use): (record, version from 1) -> bytes."""
    from confluent_kafka.schema_registry.avro import AvroSerializer

    registry = SchemaRegistry.at(endpoint)
    serializers = [AvroSerializer(registry._client, json.dumps(s)) for s in schemas]
    return _serialize(registry, topic, [(s, lambda record: record) for s in serializers])


def protobuf_serializer(endpoint: RegistryEndpoint, topic: str, descriptor_sets: Sequence[bytes],
                        message: str) -> Callable[[dict[str, Any], int], bytes]:
    """The registry client's own ProtobufSerializer for ``topic``'s values, one per version of
    ``message`` (a descriptor set each): (record, version from 1) -> bytes, its None fields
    left unset."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import message_factory

    from orchestrator.formats.protobuf_types import message_descriptor

    registry = SchemaRegistry.at(endpoint)
    written = []
    for descriptors in descriptor_sets:
        cls = message_factory.GetMessageClass(message_descriptor(descriptors, message, topic))
        written.append((ProtobufSerializer(cls, registry._client), _filled(cls)))
    return _serialize(registry, topic, written)


def _filled(cls: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda record: cls(**{k: v for k, v in record.items() if v is not None})


def _serialize(registry: SchemaRegistry, topic: str,
               serializers: Sequence[tuple[Callable[[Any, Any], bytes | None],
                                           Callable[[dict[str, Any]], Any]]]
               ) -> Callable[[dict[str, Any], int], bytes]:
    from confluent_kafka.serialization import MessageField, SerializationContext

    context = SerializationContext(topic, MessageField.VALUE)

    def serialize(record: dict[str, Any], version: int) -> bytes:
        serializer, to_value = serializers[version - 1]
        framed = registry._call(lambda r: serializer(to_value(r), context), record,
                                f"registering {topic}-value")
        assert isinstance(framed, bytes)
        return framed
    return serialize
