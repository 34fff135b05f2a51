"""How a replay reads through the schema registry (#62): its executors reach the registry with
credentials that only their environment holds; a registry away is an outage that the driver
waits out, refused credentials fail the version at once; and a source's decoding is the
topic's, format and reader schema included, so that it finds the archive's decoded segments."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.archive_model.decoding import Decoding
from orchestrator.models import EventFormat, JobSpec, TopicInput
from orchestrator.settings import load_settings
from orchestrator.spark.failures import is_outage, job_error

READER = json.dumps({"type": "record", "name": "PageView", "fields": [
    {"name": "user_id", "type": "long"}]}, sort_keys=True, separators=(",", ":"))
AVRO = TopicInput("t", "user_id bigint", (), "dead_letter",
                  format=EventFormat("avro", READER, source="page_view.avsc"))
ENV = {"KAPPA_SCHEMA_REGISTRY_URL": "http://registry.example:8081",
       "KAPPA_SCHEMA_REGISTRY_USER_INFO": "reader:pw-8d1f"}
RELAYED = """[STREAM_FAILED] Query [id = f1] terminated with exception: An exception was thrown
PythonException: An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "source.py", line 290, in read
orchestrator.errors.{name}: the schema registry at http://registry.example:8081 {what}
"""


def _options(s, source: TopicInput = AVRO) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from orchestrator.spark.read.source import source_options

    return source_options(
        kafka=s.kafka, source=source, group_id="g", start_offsets={}, chunk_records=1,
        max_batch_records=1, version_id=1, catalog_schema="kappa", job="j", version="v1",
        registry=s.schema_registry)


def test_executors_get_the_registry_credentials_from_their_environment_only(
        tmp_path: Path) -> None:
    from orchestrator.spark.read.source import source_registry
    from orchestrator.spark.session import _REDACT, spark_conf

    s = load_settings(env={**ENV, "KAPPA_KAFKA_BOOTSTRAP": "b:9092"}, cwd=tmp_path)
    options = _options(s)
    conf = spark_conf(s, "app", None)
    listed = {k: v for k, v in conf.items() if not k.startswith("spark.executorEnv.")}
    assert "pw-8d1f" not in json.dumps(options) + json.dumps(listed)
    (key,) = [k for k, v in conf.items() if k.startswith("spark.executorEnv.")
              and v == "reader:pw-8d1f"]
    assert re.search(_REDACT, key)
    endpoint = source_registry(options, {"KAPPA_SCHEMA_REGISTRY_USER_INFO": "reader:pw-8d1f"})
    assert endpoint is not None and endpoint.url == "http://registry.example:8081"
    assert endpoint.user_info == "reader:pw-8d1f" and endpoint.token is None
    without = load_settings(env={"KAPPA_KAFKA_BOOTSTRAP": "b:9092"}, cwd=tmp_path)
    assert source_registry(_options(without), {}) is None


def test_a_sources_decoding_is_its_topics_with_the_format() -> None:
    from orchestrator.spark.read.source import source_decoding

    s = load_settings(env={**ENV, "KAPPA_KAFKA_BOOTSTRAP": "b:9092"}, cwd=Path("/"))
    assert source_decoding(_options(s)) == Decoding.of(AVRO)
    plain = TopicInput("t", "user_id bigint", (), "dead_letter")
    assert source_decoding(_options(s, plain)) == Decoding.of(plain)
    assert Decoding.of(plain).fingerprint != Decoding.of(AVRO).fingerprint


def test_a_registry_away_is_waited_out_and_refused_credentials_fail_at_once() -> None:
    away = Exception(RELAYED.format(
        name="RegistryUnavailableError",
        what="cannot be reached for schema id 2 (ConnectError); the read resumes once it answers"))
    assert is_outage(away) and job_error(away) is None
    refused = Exception(RELAYED.format(
        name="RegistryAuthError",
        what="refused the credentials for schema id 2 (HTTP 401: Unauthorized): set "
             "KAPPA_SCHEMA_REGISTRY_USER_INFO or KAPPA_SCHEMA_REGISTRY_TOKEN, then restart the "
             "version"))
    assert not is_outage(refused)
    error = job_error(refused)
    assert error is not None and str(error).startswith(
        "the schema registry at http://registry.example:8081 refused the credentials")


def test_the_log_is_sampled_at_spread_places_ending_with_its_last_records() -> None:
    from orchestrator.kafka.writer_ids import PLACES, RECORDS_PER_PLACE, places

    assert places(5, 5) == [] and places(0, 20) == [0, 16]
    spread = places(100, 100_100)
    assert len(spread) == PLACES and spread[0] == 100
    assert spread[-1] + RECORDS_PER_PLACE == 100_100
    assert all(b - a >= RECORDS_PER_PLACE for a, b in itertools.pairwise(spread))


def test_deploy_refuses_a_reader_that_cannot_read_a_writer_of_the_log(tmp_path: Path) -> None:
    from orchestrator.errors import JobFileError
    from orchestrator.samples.sample_avro import PAGE_VIEW_V1, PAGE_VIEW_V2
    from orchestrator.settings import Settings
    from orchestrator.versions.registry_formats import refuse_unreadable_writers

    from registry_standin import RegistryStandIn

    registry = RegistryStandIn()
    try:
        for schema in (PAGE_VIEW_V1, PAGE_VIEW_V2):
            registry.register("t-value", json.dumps(schema), "AVRO")
        settings = Settings(schema_registry_url=registry.url)
        needs_country = {**PAGE_VIEW_V2, "fields": [*PAGE_VIEW_V2["fields"],
                                                    {"name": "country", "type": "string"}]}
        sampled = {1: (0, 7), 2: (3, 4_000), 999_999: (1, 2)}  # an unknown id: not the reader's
        for reader, refused in ((PAGE_VIEW_V2, None), (PAGE_VIEW_V1, None), (needs_country, (
                "the reader schema of t cannot read the records written with schema id 1 "
                "(t-value version 1; one at partition 0 offset 7): field country: the writer "
                "has no such field, and the reader gives it no default. Give the field a "
                "default"))):
            text = json.dumps(reader, sort_keys=True, separators=(",", ":"))
            spec = replace(load_spec(), inputs=(replace(AVRO, format=EventFormat(
                "avro", text, source="inline")),))
            if refused is None:
                refuse_unreadable_writers(spec, settings, lambda _topic: sampled)
                continue
            with pytest.raises(JobFileError) as raised:
                refuse_unreadable_writers(spec, settings, lambda _topic: sampled)
            assert refused in str(raised.value) and "\n" not in str(raised.value)
            assert "--allow-incompatible" in str(raised.value)
    finally:
        registry.close()


def load_spec() -> JobSpec:
    from orchestrator.jobspec import parse_job_source

    return parse_job_source("\n".join([
        'NAME = "pv"', 'VERSION = "v1"', 'TOPICS = ["t"]', 'KEY_COLUMNS = ["user_id"]',
        'OUTPUT_SCHEMA = {"user_id": "bigint"}', 'EVENT_SCHEMA = "user_id bigint"',
        "def transform(events):", "    return events", ""]), "pv.py")
