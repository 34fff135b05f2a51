"""Read tasks build and move only the source columns a job reads
(orchestrator/spark/read/pruning.py): a job that reads the Kafka key, headers and timestamp
still gets them exactly, and pageview_counts' sources declare only the columns its plan reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import job_file, wait_until
from integration.helpers import output, query
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]

METADATA = '''
NAME = "metadata"
VERSION = "v1"
MODE = "stream"
TOPICS = ["{topic}"]
EVENT_SCHEMA = "user_id bigint, url string, ts bigint, duration_ms bigint"
OUTPUT_MODE = "append"
KEY_COLUMNS = ["partition", "offset"]
OUTPUT_SCHEMA = {{"partition": "integer", "offset": "bigint", "user_id": "bigint",
                 "key": "text", "headers": "integer", "first_header": "text",
                 "timestamp_ms": "bigint"}}


def transform(events):
    from pyspark.sql import functions as F

    return events.select(
        F.col("kafka_partition").alias("partition"), F.col("kafka_offset").alias("offset"),
        "user_id", F.col("kafka_key").alias("key"),
        F.size("kafka_headers").cast("int").alias("headers"),
        F.col("kafka_headers")[0]["value"].cast("string").alias("first_header"),
        F.unix_millis("kafka_timestamp").alias("timestamp_ms"))
'''


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for i in range(count):
        event = {"user_id": i, "url": f"/p/{i % 7}", "ts": i, "duration_ms": i % 100}
        headers = [("trace", f"t{i}".encode()), ("n", b"x")] if i % 3 else None
        producer.produce(topic, json.dumps(event).encode(), key=f"k{i % 5}" if i % 4 else None,
                         headers=headers, timestamp=1_700_000_000_000 + i)
    assert producer.flush(30) == 0


def _reference(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple[Any, ...]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pruning-reference",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending, rows = set(partitions), {}
        while pending:
            for msg in consumer.consume(1000, 1.0):
                if msg.error():
                    pending.discard(msg.partition())
                    continue
                headers = msg.headers() or []
                rows[(msg.partition(), msg.offset())] = (
                    json.loads(msg.value())["user_id"],
                    msg.key().decode() if msg.key() is not None else None,
                    len(headers) if headers else None,  # Spark 4's size() of a null array
                    headers[0][1].decode() if headers else None, msg.timestamp()[1])
        return rows
    finally:
        consumer.close()


def test_a_job_reading_kafka_metadata_gets_it_exactly(service, settings, topic,
                                                      tmp_path: Path) -> None:
    from orchestrator.kafka.admin import ensure_topic

    ensure_topic(settings.kafka, topic, 4)
    _produce(settings.kafka_bootstrap, topic, 3_000)
    job = tmp_path / "metadata.py"
    job.write_text(METADATA.format(topic=topic))
    service.deploy(job)
    service.wait("metadata", "v1", timeout_s=300)
    ref = _reference(settings.kafka_bootstrap, topic)
    assert len(ref) == 3_000
    rows = query(settings, "SELECT partition, \"offset\", user_id, key, headers, first_header, "
                           f"timestamp_ms FROM {settings.data_schema}.metadata__v1")
    assert {(r[0], r[1]): tuple(r[2:]) for r in rows} == ref
    log = Path(service.version_status("metadata", "v1").log_path or "").read_text()
    assert (f"columns read: {topic}: kafka_partition, kafka_offset, kafka_timestamp, kafka_key, "
            "kafka_headers, user_id") in log


def test_pageview_counts_reads_only_what_it_aggregates(service, settings, topic,
                                                       tmp_path: Path) -> None:
    service.produce_sample(topic, 20_000, seed=5)
    service.deploy(job_file(tmp_path, "v2", topic))
    service.wait("pageview_counts", "v2", timeout_s=300)
    ref = compute(settings.kafka_bootstrap, topic)
    wait_until(lambda: output(settings, "pageview_counts__v2") == ref.v2, 30,
               "v2's output to equal the reference")
    log = Path(service.version_status("pageview_counts", "v2").log_path or "").read_text()
    # A batch job keeps the offsets' columns: a quarantined batch is re-run range by range.
    assert (f"columns read: {topic}: kafka_topic, kafka_partition, kafka_offset, url, "
            "duration_ms") in log
