"""EVENT_FORMAT in a job (#62 step 4): the reader schema named by the job (an .avsc file, an
inline record, a registry subject pinned at deploy, a Protobuf descriptor set), the events'
fields derived from it, its bytes in the deployed code and the fingerprint, and one-line
refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor as F

from orchestrator.errors import JobFileError
from orchestrator.job_inputs import pin_registry_schemas
from orchestrator.jobspec import load_job_file, parse_job_source, spec_from_catalog, spec_to_json

_PAGE_VIEW = {"type": "record", "name": "PageView", "namespace": "shop", "fields": [
    {"name": "user_id", "type": "long"},
    {"name": "url", "type": "string"},
    {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                        "precision": 10, "scale": 2}], "default": None},
]}


def _job(schema: str, fmt: str | None = '"avro"', extra: str = "") -> str:
    return "\n".join([
        'NAME = "pv"', 'VERSION = "v1"', 'TOPICS = ["views"]', 'KEY_COLUMNS = ["user_id"]',
        'OUTPUT_SCHEMA = {"user_id": "bigint", "n": "bigint"}',
        *([f"EVENT_FORMAT = {fmt}"] if fmt else []), f"EVENT_SCHEMA = {schema}", extra,
        "def transform(events):", "    return events", ""])


def _file_job(tmp_path: Path, schema: str, avsc: Any = _PAGE_VIEW, **kw: Any) -> Path:
    (tmp_path / "page_view.avsc").write_text(json.dumps(avsc, indent=2))
    job = tmp_path / "v1.py"
    job.write_text(_job(schema, **kw))
    return job


def test_an_avsc_beside_a_job_file_gives_its_fields_and_joins_its_code(tmp_path: Path) -> None:
    spec = load_job_file(_file_job(tmp_path, '"page_view.avsc"'))
    (topic_input,) = spec.inputs
    assert topic_input.schema == "`user_id` bigint, `url` string, `price` decimal(10,2)"
    assert topic_input.format.kind == "avro" and topic_input.format.source == "page_view.avsc"
    assert json.loads(topic_input.format.reader) == _PAGE_VIEW
    assert [path for path, _ in spec.files] == ["v1.py", "page_view.avsc"]
    # The reader schema is code: another one is another fingerprint; the same one written
    # otherwise (the file's layout) is the same reader.
    before = spec.fingerprint
    changed = {**_PAGE_VIEW, "fields": _PAGE_VIEW["fields"][:2]}
    assert load_job_file(_file_job(tmp_path, '"page_view.avsc"', changed)).fingerprint != before
    (tmp_path / "page_view.avsc").write_text(json.dumps(_PAGE_VIEW))
    assert load_job_file(tmp_path / "v1.py").inputs == spec.inputs


def test_the_fields_are_derived_not_declared_twice(tmp_path: Path) -> None:
    spec = load_job_file(_file_job(tmp_path, '"page_view.avsc"'))
    inline = parse_job_source(_job(repr(_PAGE_VIEW)), "inline.py")
    assert inline.inputs[0].schema == spec.inputs[0].schema
    assert inline.inputs[0].format.source == "inline"


def test_a_directory_job_names_its_own_file(tmp_path: Path) -> None:
    job = tmp_path / "pv"
    (job / "schemas").mkdir(parents=True)
    (job / "schemas" / "page_view.avsc").write_text(json.dumps(_PAGE_VIEW))
    (job / "job.py").write_text(_job('"schemas/page_view.avsc"'))
    spec = load_job_file(job)
    assert spec.inputs[0].format.source == "schemas/page_view.avsc"
    assert sorted(p for p, _ in spec.files) == ["job.py", "schemas/page_view.avsc"]


def test_the_format_survives_the_catalog(tmp_path: Path) -> None:
    spec = load_job_file(_file_job(tmp_path, '"page_view.avsc"'))
    doc = json.loads(json.dumps(spec_to_json(spec)))
    back = spec_from_catalog(doc, spec.source, spec.fingerprint, spec.path)
    assert back.inputs == spec.inputs
    json_job = parse_job_source(_job('"user_id bigint"', fmt=None), "j.py")
    doc = json.loads(json.dumps(spec_to_json(json_job)))
    assert doc["inputs"][0]["format"] is None
    assert spec_from_catalog(doc, "", "", "j.py").inputs == json_job.inputs


def test_a_registry_subject_is_pinned_at_deploy() -> None:
    spec = parse_job_source(_job('{"subject": "views-value", "version": "latest"}',
                                 extra='NON_NEGATIVE = ["user_id"]'), "reg.py")
    assert spec.unpinned == ("views",) and spec.inputs[0].schema == ""
    asked: list[tuple[str, Any]] = []

    def fetch(subject: str, version: int | str) -> tuple[str, int]:
        asked.append((subject, version))
        return json.dumps(_PAGE_VIEW), 3

    pinned = pin_registry_schemas(spec, fetch)
    assert asked == [("views-value", "latest")] and not pinned.unpinned
    assert pinned.inputs[0].format.source == "views-value@3"
    assert pinned.inputs[0].schema == parse_job_source(
        _job(repr(_PAGE_VIEW)), "x.py").inputs[0].schema
    assert pinned.fingerprint != spec.fingerprint
    # Another registered schema under the same declaration is another code.
    other = pin_registry_schemas(spec, lambda s, v: (json.dumps(
        {**_PAGE_VIEW, "fields": _PAGE_VIEW["fields"][:2]}), 4))
    assert other.fingerprint not in (pinned.fingerprint, spec.fingerprint)
    # The job's checks apply to the fetched fields.
    bad = parse_job_source(_job('{"subject": "views-value", "version": 2}',
                                extra='NON_NEGATIVE = ["url"]'), "reg.py")
    with pytest.raises(JobFileError, match="NON_NEGATIVE"):
        pin_registry_schemas(bad, fetch)


def _descriptor_set() -> bytes:
    message = descriptor_pb2.DescriptorProto(name="PageView")
    message.field.add(name="user_id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    message.field.add(name="url", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    file = descriptor_pb2.FileDescriptorProto(name="pv.proto", package="shop", syntax="proto3")
    file.message_type.append(message)
    return descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString()


def test_a_protobuf_message_of_a_descriptor_set(tmp_path: Path) -> None:
    (tmp_path / "pv.desc").write_bytes(_descriptor_set())
    job = tmp_path / "v1.py"
    job.write_text(_job('{"descriptor_set": "pv.desc", "message": "shop.PageView"}',
                        fmt='{"views": "protobuf"}'))
    spec = load_job_file(job)
    (topic_input,) = spec.inputs
    assert topic_input.format.kind == "protobuf" and topic_input.format.message == "shop.PageView"
    assert topic_input.schema == "`user_id` bigint, `url` string"
    assert dict(spec.files)["pv.desc"] == _descriptor_set()
    with pytest.raises(JobFileError, match="has no message 'PageView'"):
        job.write_text(_job('{"descriptor_set": "pv.desc", "message": "PageView"}',
                            fmt='"protobuf"'))
        load_job_file(job)


@pytest.mark.parametrize(("schema", "fmt", "says"), [
    ('"page_view.avsc"', '"parquet"', "EVENT_FORMAT must be one of 'json', 'avro', 'protobuf'"),
    ('"page_view.avsc"', None, "declare EVENT_FORMAT = 'avro'"),
    ('"missing.avsc"', '"avro"', "'missing.avsc', which is not beside the job"),
    ('"../page_view.avsc"', '"avro"', "no '..', not absolute"),
    ('"user_id bigint"', '"avro"', "an .avsc file of the job, a record schema, or"),
    ('{"subject": "s", "version": 0}', '"avro"', "a number from 1 or \"latest\""),
    ('{"subject": "", "version": 1}', '"avro"', "names a registry subject"),
    ('{"type": "record", "name": "R", "fields": [{"name": "b", "type": "bytes"}]}', '"avro"',
     "EVENT_SCHEMA: field b is of Avro type bytes, which has no Spark type here"),
    ('{"type": "record", "name": "R", "fields": [{"name": "kafka_offset", "type": "long"}]}',
     '"avro"', "'kafka_offset', reserved"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}', '"avro"',
     "is not a valid Avro schema"),
    ('{"descriptor_set": "pv.desc"}', '"protobuf"', '"message": "<package.Message>"'),
    ('"page_view.avsc"', '{"other": "avro"}', "EVENT_FORMAT names topic 'other'"),
])
def test_a_bad_declaration_is_one_line_saying_what_to_do(
        tmp_path: Path, schema: str, fmt: str | None, says: str) -> None:
    with pytest.raises(JobFileError) as raised:
        load_job_file(_file_job(tmp_path, schema, fmt=fmt))
    assert says in str(raised.value) and "\n" not in str(raised.value), str(raised.value)


def test_deploy_asks_a_registry_for_avro_and_pins_a_subjects_latest(tmp_path: Path) -> None:
    from orchestrator.errors import ConfigError
    from orchestrator.settings import Settings
    from orchestrator.versions.registry_formats import registry_formats

    from registry_standin import RegistryStandIn

    spec = load_job_file(_file_job(tmp_path, '"page_view.avsc"'))
    with pytest.raises(ConfigError, match=re.escape(
            "the events of views are avro in the schema registry's wire format, and no schema "
            "registry is configured: set schema_registry_url")):
        registry_formats(spec, Settings())
    plain = parse_job_source(_job('"user_id bigint"', fmt=None), "j")
    assert registry_formats(plain, Settings()) is plain
    registry = RegistryStandIn(users={"deployer": "pw-4"})
    try:
        registry.register("views-value", json.dumps(_PAGE_VIEW), "AVRO")
        settings = Settings(schema_registry_url=registry.url,
                            schema_registry_user_info="deployer:pw-4")
        assert registry_formats(spec, settings) is spec  # its reader is a file: nothing to pin
        latest = parse_job_source(_job('{"subject": "views-value"}'), "j")
        pinned = registry_formats(latest, settings)
    finally:
        registry.close()
    (topic_input,) = pinned.inputs
    assert topic_input.format.source == "views-value@1" and not pinned.unpinned
    assert topic_input.schema == spec.inputs[0].schema
    assert pinned.fingerprint != latest.fingerprint


def test_the_avro_example_job_reads_both_sample_versions_with_its_reader() -> None:
    from orchestrator.formats.avro_compat import unreadable
    from orchestrator.samples.sample_avro import PAGE_VIEW_V1, PAGE_VIEW_V2

    root = Path(__file__).resolve().parents[2]
    spec = load_job_file(root / "jobs" / "pageview_referrers" / "v1")
    (topic_input,) = spec.inputs
    reader = json.loads(topic_input.format.reader)
    assert reader == PAGE_VIEW_V2
    assert topic_input.schema == ("`user_id` bigint, `url` string, `ts` bigint, "
                                  "`duration_ms` bigint, `referrer` string")
    assert unreadable(PAGE_VIEW_V1, reader) is None and unreadable(PAGE_VIEW_V2, reader) is None
    # And a job still on the first version reads the second's records: it skips referrer.
    assert unreadable(PAGE_VIEW_V2, PAGE_VIEW_V1) is None
