"""Promises of the README that no other test keeps: append mode is exactly once across a
restart and a SIGKILL; a restart runs the code that was deployed, whatever the job's files say
now; folding old batch records keeps the exactly-once books and the dead-letter counts; MERGE
"min" and "max" merge batches as the whole log would."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import kappa_cli, wait_until
from integration.helpers import query, stop_drivers
from reference import read_log

pytestmark = [pytest.mark.integration, pytest.mark.spark]

APPENDED = '''
NAME = "appended"
VERSION = "v1"
MODE = "stream"
TOPICS = ["{topic}"]
EVENT_SCHEMA = "user_id bigint, url string, ts bigint, duration_ms bigint"
NON_NEGATIVE = ["duration_ms"]
OUTPUT_MODE = "append"
KEY_COLUMNS = ["partition", "offset"]
OUTPUT_SCHEMA = {{"partition": "integer", "offset": "bigint", "user_id": "bigint"}}


def transform(events):
    from pyspark.sql import functions as F

    return events.select(F.col("kafka_partition").alias("partition"),
                         F.col("kafka_offset").alias("offset"), "user_id")
'''

BOOKS = '''
NAME = "books"
VERSION = "v1"
TOPICS = ["{topic}"]
EVENT_SCHEMA = {{"user_id": "long", "url": "string", "ts": "long", "duration_ms": "long"}}
NON_NEGATIVE = ["duration_ms"]
KEY_COLUMNS = ["url"]
OUTPUT_SCHEMA = {{"url": "text", "views": "bigint", "first_ts": "bigint", "last_ts": "bigint",
                 "shortest_ms": "bigint", "longest_ms": "bigint"}}
MERGE = {{"views": "sum", "first_ts": "min", "last_ts": "max", "shortest_ms": "min",
         "longest_ms": "max"}}


def transform(events):
    from pyspark.sql import functions as F

    return events.groupBy("url").agg(
        F.count(F.lit({weight})).alias("views"), F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"), F.min("duration_ms").alias("shortest_ms"),
        F.max("duration_ms").alias("longest_ms"))
'''


def _valid(value: bytes | None) -> dict[str, Any] | None:
    try:
        event = json.loads(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not isinstance(event, dict):
        return None
    for name, kind in (("user_id", int), ("url", str), ("ts", int), ("duration_ms", int)):
        if not isinstance(event.get(name), kind) or isinstance(event.get(name), bool):
            return None
    return event if event["duration_ms"] >= 0 else None


def _processed(service: Any, job: str) -> tuple[Any, int]:
    st = service.version_status(job, "v1")
    return st, sum(o for ps in st.processed_offsets.values() for o in ps.values())


def _kill_past(service: Any, job: str, target: int) -> None:
    st = wait_until(lambda: (x := _processed(service, job))[0].pid and x[1] >= target and x[0],
                    300, f"{job} to pass {target}", poll_s=0.25)
    os.killpg(st.pid, signal.SIGKILL)
    wait_until(lambda: service.version_status(job, "v1").state.value == "failed", 30,
               f"{job}'s dead driver to be noticed")


def test_append_mode_is_exactly_once_across_a_restart_and_a_sigkill(
        settings, topic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.service import Orchestrator

    service = Orchestrator(replace(settings, max_batch_records=2_000, chunk_records=1_000))
    service.produce_sample(topic, 24_000, seed=71)
    path = tmp_path / "appended.py"
    path.write_text(APPENDED.format(topic=topic))
    try:
        # The first driver dies right after its fourth batch's PostgreSQL commit: Spark's commit
        # log does not know the batch, so the next driver runs it again, and must insert nothing.
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "batch.after_pg_commit=3*off->1*exit")
        service.deploy(path)
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        wait_until(lambda: service.version_status("appended", "v1").state.value == "failed",
                   300, "the driver to die at the fail point")
        service.restart("appended", "v1")
        _kill_past(service, "appended", 10_000)
        service.restart("appended", "v1")
        wait_until(lambda: _processed(service, "appended")[1] >= 16_000, 300,
                   "the restarted replay to pass 16,000")
        # A restart while the driver runs: it is stopped and replaced.
        assert kappa_cli(settings, "restart", "appended", "v1").returncode == 0
        assert service.wait("appended", "v1", timeout_s=300).attempt == 4
        expected = [(p, o, e["user_id"]) for p, o, v in read_log(settings.kafka_bootstrap, topic)
                    if (e := _valid(v)) is not None]
        rows = query(settings, f'SELECT partition, "offset", user_id FROM '
                               f"{settings.data_schema}.appended__v1")
        assert len(rows) == len(expected)  # nothing twice (the key would refuse it), none lost
        assert sorted(rows) == sorted(expected)
    finally:
        stop_drivers(service)


def test_restart_runs_the_deployed_code_and_folding_keeps_the_books(
        settings, topic, tmp_path: Path) -> None:
    from orchestrator.service import Orchestrator

    # Batches of 300 records, and only the 5 latest batch records kept in full.
    service = Orchestrator(replace(settings, max_batch_records=300, chunk_records=300,
                                   batches_kept=5))
    # About 34 batches: more than 20 folded away past the 5 kept (and the kill's window).
    service.produce_sample(topic, 10_000, seed=72)
    path = tmp_path / "books.py"
    path.write_text(BOOKS.format(topic=topic, weight=1))
    try:
        service.deploy(path)
        _kill_past(service, "books", 4_000)
        # The job's file changes after the deploy: a restart still runs the deployed code.
        path.write_text(BOOKS.format(topic=topic, weight=1).replace(
            'F.count(F.lit(1)).alias("views")', 'F.sum(F.lit(2)).alias("views")'))
        service.restart("books", "v1")
        st = service.wait("books", "v1", timeout_s=600)
        assert st.attempt == 2

        log = read_log(settings.kafka_bootstrap, topic)
        events = [e for _, _, v in log if (e := _valid(v)) is not None]
        views = Counter(e["url"] for e in events)
        expected = {url: (n, min(e["ts"] for e in events if e["url"] == url),
                          max(e["ts"] for e in events if e["url"] == url),
                          min(e["duration_ms"] for e in events if e["url"] == url),
                          max(e["duration_ms"] for e in events if e["url"] == url))
                    for url, n in views.items()}
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            rows = conn.execute(sql.SQL(
                "SELECT url, views, first_ts, last_ts, shortest_ms, longest_ms FROM {}.{}")
                .format(sql.Identifier(settings.data_schema),
                        sql.Identifier("books__v1"))).fetchall()
        assert {r[0]: tuple(r[1:]) for r in rows} == expected

        # The books: folded records and kept ones add up to the log, once each.
        invalid = len(log) - len(events)
        schema = settings.catalog_schema
        (summary,) = query(settings, f"SELECT batches, records, dead_letters FROM "
                                     f"{schema}.batch_summary")
        kept = query(settings, f"SELECT count(*), sum(records), sum(dead_letters) FROM "
                               f"{schema}.batches")[0]
        assert summary[0] >= 20 and kept[0] <= 5 + 5  # pruned every 5 commits
        assert summary[1] + kept[1] == len(log)
        assert summary[2] + kept[2] == invalid
        assert service.status("books", exact_rows=False)[0].dead_letters == invalid
        assert st.dead_letters == invalid  # the table itself
    finally:
        stop_drivers(service)
