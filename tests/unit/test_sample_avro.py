"""The Avro page-view sample (#62): the JSON sample's events, serialized by the registry's own
AvroSerializer under two schema versions registered with the stand-in registry, read back with
the second version as the example job reads them; its invalid events are dead letters at the
same offsets as the JSON sample's, for the Avro reasons."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.formats.avro_events import AvroEventParser
from orchestrator.kafka.registry import SchemaRegistry
from orchestrator.parsing import EventParser
from orchestrator.samples.sample import sample_events
from orchestrator.samples.sample_avro import SCHEMAS, framed_sample_events

from registry_standin import RegistryStandIn


@pytest.fixture
def standin() -> Iterator[RegistryStandIn]:
    registry = RegistryStandIn()
    yield registry
    registry.close()


def _serialize(url: str) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": url})
    serializers = [AvroSerializer(client, json.dumps(s)) for s in SCHEMAS]
    context = SerializationContext("pageviews", MessageField.VALUE)
    return lambda record, version: serializers[version - 1](record, context)


def test_the_avro_sample_is_the_json_samples_events_under_two_schema_versions(
        standin: RegistryStandIn) -> None:
    count, seed = 4_000, 7
    avro = list(framed_sample_events(count, seed, _serialize(standin.url), invalid_share=0.02))
    plain = list(sample_events(count, seed, invalid_share=0.02))
    assert [k for k, _ in avro] == [k for k, _ in plain]
    assert standin.subjects == {"pageviews-value": [1, 2]}
    reader = AvroEventParser(SCHEMAS[1], SchemaRegistry(standin.url).avro_schema,
                             non_negative=["duration_ms"])
    json_parser = EventParser([("user_id", "long"), ("url", "string"), ("ts", "long"),
                               ("duration_ms", "long")], non_negative=["duration_ms"])
    reasons: Counter[str] = Counter()
    for i, ((_, value), (_, text)) in enumerate(zip(avro, plain, strict=True)):
        got, error = reader.parse(value)
        expected, json_error = json_parser.parse(text)
        assert (got is None) == (expected is None), (i, error, json_error)
        if got is None:
            reasons[(error or "").split(":")[0].split(" of writer")[0]] += 1
            continue
        assert got[:4] == expected
        assert got[4] == (None if i < count // 2 or got[0] % 3 else "/")
    assert reader.writer_ids == {1, 2}
    assert set(reasons) == {
        "not in the schema registry's wire format", "not Avro",
        "unknown schema id 999999", "field duration_ms is negative"}, reasons
    assert all(n >= 5 for n in reasons.values()), reasons
