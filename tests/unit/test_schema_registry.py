"""The schema registry through confluent_kafka's own client (#62): writer schemas by id,
cached per id, registered and written by the real client and serializer; an unknown id is a
dead letter, a registry away an outage that passes, refused credentials an error at once. The
registry is tests/registry_standin.py (no registry server installs here: docs/formats.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.errors import RegistryAuthError, RegistryUnavailableError
from orchestrator.formats.avro_events import AvroEventParser
from orchestrator.kafka.registry import SchemaRegistry, shown_url

from registry_standin import RegistryStandIn

V1 = {"type": "record", "name": "PageView", "namespace": "kappa.samples",
      "fields": [{"name": "user_id", "type": "long"}, {"name": "url", "type": "string"}]}
V2 = {**V1, "fields": [*V1["fields"],
                       {"name": "referrer", "type": ["null", "string"], "default": None}]}


@pytest.fixture
def standin() -> Iterator[RegistryStandIn]:
    registry = RegistryStandIn(users={"reader": "s3cret-pw"}, tokens=("t0ken",))
    yield registry
    registry.close()


def _serializer(standin: RegistryStandIn, schema: dict[str, Any]) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": standin.url, "basic.auth.user.info": "reader:s3cret-pw"})
    serialize = AvroSerializer(client, json.dumps(schema))
    context = SerializationContext("pageviews", MessageField.VALUE)
    return lambda record: serialize(record, context)


def test_records_written_by_the_real_serializer_under_two_schemas_read_with_todays(
        standin: RegistryStandIn) -> None:
    old, new = _serializer(standin, V1), _serializer(standin, V2)
    values = [old({"user_id": 1, "url": "/a"}), new({"user_id": 2, "url": "/b", "referrer": "/a"}),
              old({"user_id": 3, "url": "/c"})]
    assert standin.subjects == {"pageviews-value": [1, 2]}
    registry = SchemaRegistry(standin.url, user_info="reader:s3cret-pw")
    parser = AvroEventParser(V2, registry.avro_schema)
    assert [parser.parse(v) for v in values] == [
        ((1, "/a", None), None), ((2, "/b", "/a"), None), ((3, "/c", None), None)]
    # Each writer schema was fetched once: the client's cache and the parser's.
    assert standin.requests["GET /schemas/ids/1"] == 1
    assert standin.requests["GET /schemas/ids/2"] == 1
    assert parser.writer_ids == {1, 2}
    assert registry.avro_schema(99) is None  # unknown: the record's fault, a dead letter
    standin.register("pageviews-proto", 'syntax = "proto3"; message M { int64 a = 1; }',
                     "PROTOBUF")
    assert registry.avro_schema(3) is None


def test_a_bearer_token_and_refused_credentials(standin: RegistryStandIn) -> None:
    standin.register("s-value", json.dumps(V1), "AVRO")
    assert SchemaRegistry(standin.url, token="t0ken").avro_schema(1) == V1
    for refused in (SchemaRegistry(standin.url, user_info="reader:wrong-pw"),
                    SchemaRegistry(standin.url, token="stale"), SchemaRegistry(standin.url)):
        with pytest.raises(RegistryAuthError, match=r"refused the credentials for schema id 1 "
                           r"\(HTTP 401") as error:
            refused.avro_schema(1)
        assert "wrong-pw" not in str(error.value) and "stale" not in str(error.value)


def test_a_registry_away_is_an_outage_that_passes(standin: RegistryStandIn) -> None:
    standin.register("s-value", json.dumps(V1), "AVRO")
    registry = SchemaRegistry(f"http://reader:s3cret-pw@127.0.0.1:{standin.port}",
                              timeout_s=2.0, retries=0)
    standin.away()
    with pytest.raises(RegistryUnavailableError, match="cannot be reached for schema id 1") as away:
        registry.avro_schema(1)
    assert "s3cret-pw" not in str(away.value) and registry.url == standin.url
    standin.back()
    assert registry.avro_schema(1) == V1


def test_user_info_is_never_shown() -> None:
    assert shown_url("https://u:p@registry.example:8081/x") == "https://registry.example:8081/x"
    assert shown_url("http://registry:8081") == "http://registry:8081"


def test_a_subjects_version_is_fetched_for_a_deploy_to_pin(standin: RegistryStandIn) -> None:
    from orchestrator.errors import JobFileError
    from orchestrator.kafka.registry_endpoint import RegistryEndpoint

    standin.register("pageviews-value", json.dumps(V1), "AVRO")
    standin.register("pageviews-value", json.dumps(V2), "AVRO")
    registry = SchemaRegistry.at(RegistryEndpoint(standin.url, user_info="reader:s3cret-pw"))
    (text, number) = registry.subject_schema("pageviews-value", "latest")
    assert (json.loads(text), number) == (V2, 2)
    (text, number) = registry.subject_schema("pageviews-value", 1)
    assert (json.loads(text), number) == (V1, 1)
    with pytest.raises(JobFileError, match="has no subject pageviews-value version 3: register"):
        registry.subject_schema("pageviews-value", 3)
    with pytest.raises(JobFileError, match="has no subject nothing version latest"):
        registry.subject_schema("nothing", "latest")
    standin.register("pageviews-proto", 'syntax = "proto3"; message M { int64 a = 1; }',
                     "PROTOBUF")
    with pytest.raises(JobFileError, match="is a PROTOBUF schema, not Avro"):
        registry.subject_schema("pageviews-proto", 1)
    refused = SchemaRegistry.at(RegistryEndpoint(standin.url, user_info="reader:wrong"))
    with pytest.raises(RegistryAuthError, match="refused the credentials for subject"):
        refused.subject_schema("pageviews-value", 1)
