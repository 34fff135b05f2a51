"""The Protobuf page-view sample (#62): the JSON sample's events, serialized by the registry's
own ProtobufSerializer (kafka/registry.protobuf_serializer) under two versions of the message
registered with the stand-in registry, read back with the second as the example job reads
them; its invalid events are dead letters at the same offsets as the JSON sample's. The example
job's descriptor set is the sample's second version, byte for byte."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.formats.protobuf_events import ProtobufEventParser
from orchestrator.jobspec import load_job_file
from orchestrator.kafka.registry import SchemaRegistry, protobuf_serializer
from orchestrator.kafka.registry_endpoint import RegistryEndpoint
from orchestrator.parsing import EventParser
from orchestrator.samples.sample import sample_events
from orchestrator.samples.sample_avro import framed_sample_events
from orchestrator.samples.sample_protobuf import DESCRIPTOR_SETS, MESSAGE

from registry_standin import RegistryStandIn

EXAMPLE = Path(__file__).resolve().parents[2] / "jobs" / "pageview_referrers_protobuf" / "v1"


@pytest.fixture
def standin() -> Iterator[RegistryStandIn]:
    registry = RegistryStandIn()
    yield registry
    registry.close()


def test_the_protobuf_sample_is_the_json_samples_events_under_two_message_versions(
        standin: RegistryStandIn) -> None:
    count, seed = 4_000, 7
    serialize = protobuf_serializer(RegistryEndpoint(standin.url), "pageviews",
                                    DESCRIPTOR_SETS, MESSAGE)
    framed = list(framed_sample_events(count, seed, serialize, invalid_share=0.02))
    plain = list(sample_events(count, seed, invalid_share=0.02))
    assert [k for k, _ in framed] == [k for k, _ in plain]
    assert standin.subjects == {"pageviews-value": [1, 2]}
    assert [kind for _, kind in standin.schemas] == ["PROTOBUF", "PROTOBUF"]
    registry = SchemaRegistry(standin.url)
    reader = ProtobufEventParser(DESCRIPTOR_SETS[1], MESSAGE, lambda i: registry.known(i) or None,
                                 non_negative=["duration_ms"])
    json_parser = EventParser([("user_id", "long"), ("url", "string"), ("ts", "long"),
                               ("duration_ms", "long")], non_negative=["duration_ms"])
    reasons: Counter[str] = Counter()
    for i, ((_, value), (_, text)) in enumerate(zip(framed, plain, strict=True)):
        got, error = reader.parse(value)
        expected, json_error = json_parser.parse(text)
        assert (got is None) == (expected is None), (i, error, json_error)
        if got is None:
            reasons[(error or "").split(":")[0].split(" of message")[0]] += 1
            continue
        assert got[:4] == expected
        assert got[4] == (None if i < count // 2 or got[0] % 3 else "/")
    assert reader.writer_ids == {1, 2}
    assert set(reasons) == {
        "not in the schema registry's wire format", "not Protobuf",
        "unknown schema id 999999", "field duration_ms is negative"}, reasons
    assert all(n >= 5 for n in reasons.values()), reasons


def test_the_example_job_reads_the_samples_second_version() -> None:
    (topic_input,) = load_job_file(EXAMPLE).inputs
    assert (EXAMPLE / "page_view.desc").read_bytes() == DESCRIPTOR_SETS[1]
    assert topic_input.format.kind == "protobuf" and topic_input.format.message == MESSAGE
    assert topic_input.schema == ("`user_id` bigint, `url` string, `ts` bigint, "
                                  "`duration_ms` bigint, `referrer` string")
