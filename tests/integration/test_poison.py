"""Poison batches: records that make `transform` raise or that produce a null key fail their
batch a bounded number of times, then the version, with the batch's offsets and the error;
`kappa restart --quarantine` isolates exactly those records and the output is exact without
them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import kappa_cli, wait_until
from integration.helpers import assert_batches_tile_the_log, dead_letters, output, stop_drivers
from reference import compute, read_log

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "poison_counts"

POISONED_JOB = '''
NAME = "poison_counts"
VERSION = "v1"
TOPICS = ["{topic}"]
EVENT_SCHEMA = {{"user_id": "long", "url": "string", "ts": "long", "duration_ms": "long"}}
NON_NEGATIVE = ["duration_ms"]
KEY_COLUMNS = ["url"]
OUTPUT_SCHEMA = {{"url": "text", "views": "bigint", "total_duration_ms": "bigint"}}
MERGE = {{"views": "sum", "total_duration_ms": "sum"}}


def transform(events):
    from pyspark.sql import functions as F

    @F.udf("string")
    def checked(url):
        if url == "/poison":
            raise ValueError("poison url " + url)
        return None if url == "/no-key" else url

    return events.withColumn("url", checked("url")).groupBy("url").agg(
        F.count(F.lit(1)).alias("views"),
        F.sum("duration_ms").alias("total_duration_ms"),
    )
'''


def _event(url: str) -> bytes:
    return json.dumps({"user_id": 7, "url": url, "ts": 1_700_000_000_000,
                       "duration_ms": 5}).encode()


def test_a_poison_record_fails_the_version_and_quarantine_isolates_it(
    settings, topic, tmp_path: Path, monkeypatch
) -> None:
    from orchestrator.failpoints import release
    from orchestrator.kafka.producer import produce
    from orchestrator.service import Orchestrator

    settings = replace(settings, max_batch_records=4_000, chunk_records=2_000)
    service = Orchestrator(settings)
    service.produce_sample(topic, 12_000, seed=61)
    produce(settings.kafka_bootstrap, topic, [(b"p", _event("/poison")), (b"p", _event("/no-key"))],
            partition=1)
    service.produce_sample(topic, 12_000, seed=62)
    path = tmp_path / "poison_counts.py"
    path.write_text(POISONED_JOB.format(topic=topic))
    try:
        service.deploy(path)
        st = wait_until(lambda: (s := service.version_status(JOB, "v1")).state.value == "failed"
                        and s, 300, "the poison batch to fail the version")
        assert "failed 3 times" in st.reason, st.reason
        assert f"{topic}/1 [" in st.reason  # the batch's offsets
        assert "ValueError: poison url /poison" in st.reason
        assert f"kappa restart --quarantine {JOB} v1" in st.reason

        ref = compute(settings.kafka_bootstrap, topic)
        poison = sorted(o for p, o, value in read_log(settings.kafka_bootstrap, topic)
                        if p == 1 and value in (_event("/poison"), _event("/no-key")))
        assert len(poison) == 2

        # The quarantine's first try pauses, holding its window open until the test has
        # checked: meanwhile the run row must be free, so that heartbeats, `kappa stop` and
        # status reads elsewhere go on.
        released = tmp_path / "released"
        released.mkdir()
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "quarantine.try=1*pause")
        monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(released))
        result = kappa_cli(settings, "restart", "--quarantine", JOB, "v1")
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        assert result.returncode == 0, result.stderr
        log = Path(service.version_status(JOB, "v1").log_path or "")
        try:
            wait_until(lambda: "fail point quarantine.try: paused" in log.read_text(), 300,
                       "the quarantine's first try to pause", poll_s=0.2)
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                assert conn.execute(sql.SQL(
                    "SELECT attempt FROM {}.runs r JOIN {}.job_versions v ON v.id = r.version_id "
                    "WHERE v.job = %s FOR UPDATE OF r NOWAIT").format(
                    sql.Identifier(settings.catalog_schema),
                    sql.Identifier(settings.catalog_schema)), (JOB,)).fetchone() == (2,)
            # Still inside the window: the check saw the quarantine mid-try.
            assert "fail point quarantine.try: released" not in log.read_text()
        finally:
            release(released, "quarantine.try")
        service.wait(JOB, "v1", timeout_s=300)

        expected = {url: counts for url, counts in ref.v1.items()
                    if url not in ("/poison", "/no-key")}
        assert output(settings, f"{JOB}__v1") == expected
        dead = dead_letters(settings, f"{JOB}__v1__dead_letters")
        assert dead == ref.invalid_offsets | {(1, o) for o in poison}
        assert_batches_tile_the_log(settings, JOB, "v1", topic, ref.log_end)
        (event,) = [e for e in service.events(JOB, "v1") if e["kind"] == "quarantine"]
        errors = {r["offset"]: r["error"] for r in event["detail"]["records"]}
        assert set(errors) == set(poison)
        assert "ValueError: poison url /poison" in errors[poison[0]]
        assert "null key" in errors[poison[1]]
    finally:
        stop_drivers(service)


def test_a_deterministic_postgres_error_fails_the_version_instead_of_retrying_for_ever(
    settings, topic, tmp_path: Path
) -> None:
    """A key too long for PostgreSQL's index (54000 "index row size exceeds maximum") fails
    every try of its batch the same way: it is a poison batch, not an outage."""
    import random
    import string

    from orchestrator.kafka.producer import produce
    from orchestrator.service import Orchestrator

    settings = replace(settings, max_batch_records=4_000, chunk_records=2_000)
    service = Orchestrator(settings)
    service.produce_sample(topic, 3_000, seed=63)
    rng = random.Random(63)
    long_url = "/" + "".join(rng.choices(string.ascii_letters + string.digits, k=60_000))
    produce(settings.kafka_bootstrap, topic, [(b"p", _event(long_url))], partition=0)
    path = tmp_path / "poison_counts.py"
    path.write_text(POISONED_JOB.format(topic=topic))
    try:
        service.deploy(path)
        st = wait_until(lambda: (s := service.version_status(JOB, "v1")).state.value == "failed"
                        and s, 120, "the batch with the long key to fail the version")
        assert "failed 3 times" in st.reason, st.reason
        assert f"{topic}/0 [" in st.reason  # the batch's offsets
        assert "ProgramLimitExceeded: index row requires" in st.reason, st.reason
        assert f"kappa restart --quarantine {JOB} v1" in st.reason

        # The remedy it names works: the record goes to the dead letters, the rest on.
        result = kappa_cli(settings, "restart", "--quarantine", JOB, "v1")
        assert result.returncode == 0, result.stderr
        service.wait(JOB, "v1", timeout_s=300)
        ref = compute(settings.kafka_bootstrap, topic)
        (long_offset,) = [o for p, o, value in read_log(settings.kafka_bootstrap, topic)
                          if p == 0 and value == _event(long_url)]
        assert output(settings, f"{JOB}__v1") == {url: counts for url, counts in ref.v1.items()
                                                  if url != long_url}
        assert dead_letters(settings, f"{JOB}__v1__dead_letters") == \
            ref.invalid_offsets | {(0, long_offset)}
    finally:
        stop_drivers(service)
