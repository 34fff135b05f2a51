"""#62 end to end: a log of Avro page views written under two schema versions (the second adds a
field with a default, halfway), replayed by v1 with the old reader schema and by v2 with the new
one into their tables, each exact against a reference that decodes every record with fastavro's
own schemaless reader and resolution; the schema registry stops in the middle of v2's replay
(v2 says why and waits, then resumes, exact); a reader schema that cannot read one of the log's
writer schemas is refused at deploy unless allowed; a bad credential fails a version at once.

The registry is the stand-in (tests/registry_standin.py: no registry server installs here)."""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import kappa_cli, wait_until
from integration.helpers import assert_batches_tile_the_log, dead_letters, stop_drivers
from reference import read_records
from registry_standin import RegistryStandIn

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pv_avro"
COUNT = 6_000
PASSWORD = "pw-e2e-31"
JOB_CODE = '''
NAME = "{job}"
VERSION = "{version}"
TOPICS = ["{topic}"]
EVENT_FORMAT = "avro"
EVENT_SCHEMA = "page_view.avsc"
NON_NEGATIVE = ["duration_ms"]
KEY_COLUMNS = ["url"]
OUTPUT_SCHEMA = {{"url": "text", "views": "bigint", "referred": "bigint"}}
MERGE = {{"views": "sum", "referred": "sum"}}


def transform(events):
    from pyspark.sql import functions as F

    return events.groupBy("url").agg(F.count(F.lit(1)).alias("views"), {referred})
'''
REFERRED = {1: 'F.lit(0).cast("bigint").alias("referred")',
            2: 'F.count("referrer").alias("referred")'}


@pytest.fixture
def registry() -> Iterator[RegistryStandIn]:
    standin = RegistryStandIn(users={"kappa": PASSWORD})
    yield standin
    standin.close()


def _job(tmp_path: Path, topic: str, version: str, reader: int,
         schema: dict[str, Any] | None = None) -> Path:
    from orchestrator.samples.sample_avro import SCHEMAS

    folder = tmp_path / "jobs" / version
    folder.mkdir(parents=True)
    (folder / "job.py").write_text(JOB_CODE.format(job=JOB, version=version, topic=topic,
                                                   referred=REFERRED[reader]))
    (folder / "page_view.avsc").write_text(json.dumps(schema or SCHEMAS[reader - 1]))
    return folder


def _reference(records: list[Any], registry: RegistryStandIn, reader: dict[str, Any]
               ) -> tuple[dict[str, tuple[int, int]], set[tuple[int, int]]]:
    """{url: (views, referred)} and the dead letters' (partition, offset), as fastavro's own
    reader decodes each record: no magic byte, an unknown id, a writer that does not resolve,
    bytes that do not read whole, a negative duration: a dead letter."""
    import fastavro

    parsed_reader = fastavro.parse_schema(reader)
    views: Counter[str] = Counter()
    referred: Counter[str] = Counter()
    dead = set()
    for partition, offset, _ts, _key, value in records:
        event = None
        if value is not None and len(value) >= 5 and value[0] == 0:
            schema_id = int.from_bytes(value[1:5], "big")
            if 1 <= schema_id <= len(registry.schemas):
                writer = fastavro.parse_schema(json.loads(registry.schemas[schema_id - 1][0]))
                body = io.BytesIO(value[5:])
                try:
                    event = fastavro.schemaless_reader(body, writer, parsed_reader)
                except Exception:
                    event = None
                if body.tell() != len(value) - 5:
                    event = None
        if event is None or event["duration_ms"] < 0:
            dead.add((partition, offset))
            continue
        views[event["url"]] += 1
        referred[event["url"]] += event.get("referrer") is not None
    return {url: (n, referred[url]) for url, n in views.items()}, dead


def _output(settings: Any, version: str) -> dict[str, tuple[int, int]]:
    import psycopg
    from psycopg import sql

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT url, views, referred FROM {}.{}").format(
            sql.Identifier(settings.data_schema), sql.Identifier(f"{JOB}__{version}"))).fetchall()
    return {url: (views, referred) for url, views, referred in rows}


def _status(service: Any, version: str) -> Any:
    return {st.version: st for st in service.status(JOB)}[version]


def test_an_avro_log_of_two_schema_versions_replays_exactly_across_a_registry_stop(
        settings: Any, topic: str, tmp_path: Path, registry: RegistryStandIn) -> None:
    from orchestrator.samples.sample_avro import SCHEMAS
    from orchestrator.service import Orchestrator

    # Small batches: v2's replay takes several, so that the registry stops in its middle.
    settings = replace(settings, schema_registry_url=registry.url,
                       schema_registry_user_info=f"kappa:{PASSWORD}", max_batch_records=1_000)
    service = Orchestrator(settings)
    try:
        service.produce_sample(topic, COUNT, seed=5, invalid_share=0.02, event_format="avro")
        records = read_records(settings.kafka_bootstrap, topic)
        assert len(records) == COUNT and registry.subjects == {f"{topic}-value": [1, 2]}
        log_end: dict[int, int] = {}
        for partition, offset, *_ in records:
            log_end[partition] = max(log_end.get(partition, 0), offset + 1)
        expected = {reader: _reference(records, registry, SCHEMAS[reader - 1])
                    for reader in (1, 2)}
        assert expected[1][1] == expected[2][1] and len(expected[1][1]) > 0
        assert sum(r for _, r in expected[2][0].values()) > 0

        service.deploy(_job(tmp_path, topic, "v1", reader=1))
        service.wait(JOB, "v1", timeout_s=300)
        # The records written under the second schema carry an id the registry gave it: v2's
        # replay asks for it once past the first half, and the registry stops right there. (Its
        # deploy asked for it once, checking that the reader reads it; the driver, a process
        # of its own, has not asked yet when the deploy returns.)
        asked = registry.requests["GET /schemas/ids/2"]
        service.deploy(_job(tmp_path, topic, "v2", reader=2))
        registry.stop_at = "/schemas/ids/2"
        assert registry.requests["GET /schemas/ids/2"] == asked + 1
        wait_until(registry.stopped.is_set, 300, "v2 to ask the registry for schema id 2")
        stalled = wait_until(lambda: (st := _status(service, "v2")).reason and
                             "schema registry" in st.reason and st, 120,
                             "v2 to say that the registry is away")
        assert "cannot be reached" in stalled.reason and PASSWORD not in stalled.reason
        assert stalled.state.value not in ("caught_up", "live", "failed")
        assert not dead_letters(settings, f"{JOB}__v2__dead_letters") - expected[2][1]
        registry.back()
        service.wait(JOB, "v2", timeout_s=300)
        for version, reader in (("v1", 1), ("v2", 2)):
            rows, dead = expected[reader]
            assert _output(settings, version) == rows, version
            assert dead_letters(settings, f"{JOB}__{version}__dead_letters") == dead, version
            assert_batches_tile_the_log(settings, JOB, version, topic, log_end)
        assert _status(service, "v2").reason is None

        # A reader that cannot read the log's first writer schema is refused at deploy, in one
        # line naming the writer and the field; allowed, its deploy goes on. The registry then
        # refuses the driver's credential: the version fails at once, saying what to set.
        needs_country = {**SCHEMAS[1], "fields": [*SCHEMAS[1]["fields"],
                                                  {"name": "country", "type": "string"}]}
        v3 = _job(tmp_path, topic, "v3", reader=2, schema=needs_country)
        incompatible = kappa_cli(settings, "deploy", str(v3))
        assert incompatible.returncode != 0
        assert (f"cannot read the records written with schema id 1 ({topic}-value version 1; "
                "one at partition") in incompatible.stderr, incompatible.stderr[-2000:]
        assert "field country: the writer has no such field" in incompatible.stderr
        bad_credential = replace(settings, schema_registry_user_info="kappa:pw-bad-9")
        allowed = kappa_cli(bad_credential, "deploy", "--allow-incompatible", str(v3))
        assert allowed.returncode == 0, allowed.stderr[-2000:]
        failed = wait_until(lambda: (st := _status(service, "v3")).state.value == "failed"
                            and st, 300, "v3 to fail")
        assert "refused the credentials" in failed.reason
        assert "KAPPA_SCHEMA_REGISTRY_USER_INFO" in failed.reason
        assert "pw-bad-9" not in failed.reason
    finally:
        stop_drivers(service)
