"""How a replay reads through the schema registry (#62): its executors reach the registry with
credentials that only their environment holds; a registry away is an outage that the driver
waits out, refused credentials fail the version at once; and a source's decoding is the
topic's, format and reader schema included, so that it finds the archive's decoded segments."""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestrator.archive_model.decoding import Decoding
from orchestrator.models import EventFormat, TopicInput
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
