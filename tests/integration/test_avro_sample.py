"""`kappa produce-sample --format avro` (#62) against the suite's broker and the stand-in
registry: both schema versions registered, every record in the wire format, and read back with
the second version, the JSON sample's rows and as many dead letters."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from conftest import kappa_cli
from reference import read_records
from registry_standin import RegistryStandIn

pytestmark = [pytest.mark.integration]


def test_produce_sample_writes_avro_under_two_registered_versions(settings, topic: str) -> None:
    from orchestrator.formats.avro_events import AvroEventParser
    from orchestrator.kafka.registry import SchemaRegistry
    from orchestrator.parsing import EventParser
    from orchestrator.samples.sample import sample_events
    from orchestrator.samples.sample_avro import SCHEMAS

    count = 2_000
    registry = RegistryStandIn(users={"writer": "pw-sample"})
    try:
        missing = kappa_cli(settings, "produce-sample", "--topic", topic, "--format", "avro")
        assert missing.returncode != 0 and "set schema_registry_url" in missing.stderr, \
            missing.stderr[-2000:]
        with_registry = replace(settings, schema_registry_url=registry.url,
                                schema_registry_user_info="writer:pw-sample")
        done = kappa_cli(with_registry, "produce-sample", "--json", "--topic", topic, "--count",
                         str(count), "--seed", "9", "--invalid-share", "0.02", "--format",
                         "avro")
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["format"] == "avro"
        assert "pw-sample" not in done.stdout + done.stderr
        assert registry.subjects == {f"{topic}-value": [1, 2]}
        records = read_records(settings.kafka_bootstrap, topic)
        reader = AvroEventParser(SCHEMAS[1], SchemaRegistry(
            registry.url, user_info="writer:pw-sample").avro_schema, ["duration_ms"])
        parsed = [reader.parse(value) for *_, value in records]
    finally:
        registry.close()
    plain = EventParser([("user_id", "long"), ("url", "string"), ("ts", "long"),
                         ("duration_ms", "long")], ["duration_ms"])
    expected = [plain.parse(value) for _, value in sample_events(count, 9, invalid_share=0.02)]
    assert len(records) == count and reader.writer_ids == {1, 2}
    assert Counter(values[:4] for values, _ in parsed if values) == \
        Counter(values for values, _ in expected if values)
    assert sum(1 for values, _ in parsed if values is None) == \
        sum(1 for values, _ in expected if values is None) > 0
