"""Stream examples re-pointed at a test's own topics, their tables and catalog figures read
back, and page views produced over past minutes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from integration.helpers import query

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "url_visitors": "jobs/url_visitors/v1.py",
    "user_profiles": "jobs/user_profiles/v1.py",
    "user_profiles_v2": "jobs/user_profiles/v2.py",
    "country_views": "jobs/country_views/v1",
}


def example(tmp_path: Path, which: str, topics: dict[str, str], version: str | None = None
            ) -> Path:
    """A copy of a shipped example reading ``topics`` ({"pageviews": "pageviews_ab12", ...})
    instead of the shipped names, optionally under another VERSION label."""
    source = ROOT / EXAMPLES[which]
    target = tmp_path / "jobs" / f"{which}_{version or 'shipped'}"
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        entry = target / "job.py"
    else:
        target.mkdir(parents=True)
        entry = target / source.name
        shutil.copy(source, entry)
    text = entry.read_text()
    for shipped, ours in topics.items():
        text = text.replace(f'"{shipped}"', f'"{ours}"')
    if version is not None:
        text = re.sub(r'^VERSION = .*$', f'VERSION = "{version}"', text, flags=re.M)
    entry.write_text(text)
    return target if source.is_dir() else entry


def table(settings: Any, name: str, key: str, columns: list[str]) -> dict[Any, tuple[Any, ...]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT {}, {} FROM {}.{}").format(
            sql.Identifier(key), sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.Identifier(settings.data_schema), sql.Identifier(name))).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def dead_letter_offsets(settings: Any, name: str, topic: str) -> set[tuple[int, int]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT partition, \"offset\" FROM {}.{} WHERE topic = %s").format(
            sql.Identifier(settings.data_schema), sql.Identifier(name)), (topic,)).fetchall()
    return {(p, o) for p, o in rows}


def archive_reads(settings: Any, job: str, version: str) -> tuple[int, int]:
    """(offsets read from the archive, of those read from its decoded segments) by the
    version's applied batches."""
    ((archived, decoded),) = query(
        settings, f"SELECT coalesce(sum(b.archived_offsets), 0), "
        f"coalesce(sum(b.decoded_offsets), 0) FROM {settings.catalog_schema}.batches b "
        f"JOIN {settings.catalog_schema}.job_versions v ON v.id = b.version_id "
        "WHERE v.job = %s AND v.version = %s", job, version)
    return int(archived), int(decoded)


def log_end(records: list[Any]) -> dict[str, int]:
    """{partition: the offset after its last record} of a topic read back."""
    ends: dict[str, int] = {}
    for partition, offset, *_ in records:
        ends[str(partition)] = max(ends.get(str(partition), 0), offset + 1)
    return ends


def read_to(service: Any, job: str, version: str, ends: dict[str, dict[str, int]]) -> bool:
    """Whether the version has committed every offset below ``ends`` ({topic: {partition:
    end}})."""
    committed = service.version_status(job, version).processed_offsets
    return all(committed.get(t, {}).get(p, 0) >= end for t, ps in ends.items()
               for p, end in ps.items())


def produce_over_minutes(bootstrap: str, topic: str, count: int, *, seed: int, minutes: int
                         ) -> None:
    """Sample page views with record timestamps spread evenly over ``minutes`` that ended a
    minute ago, so that event-time windows close."""
    import time

    from confluent_kafka import Producer

    from orchestrator.kafka.admin import ensure_topic
    from orchestrator.samples.sample import sample_events

    ensure_topic(bootstrap, topic, 4)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    # From a minute's start: the last window then holds a full minute of records, so the
    # watermark (10 s behind the newest) closes every window before it.
    first_ms = (int(time.time() * 1000) - (minutes + 1) * 60_000) // 60_000 * 60_000
    step_ms = minutes * 60_000 // count
    for i, (key, value) in enumerate(sample_events(count, seed, users=200)):
        producer.produce(topic, value=value, key=key, timestamp=first_ms + i * step_ms)
        producer.poll(0)
    assert producer.flush(30) == 0


def table_rows(settings: Any, name: str, columns: list[str]) -> set[tuple[Any, ...]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return set(conn.execute(sql.SQL("SELECT {} FROM {}.{}").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.Identifier(settings.data_schema), sql.Identifier(name))).fetchall())
